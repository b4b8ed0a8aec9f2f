"""index.html without a browser: self-contained, data block safe, evidence complete."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from opgate.reports import compat, html
from opgate.reports.merge import merge
from tests.data.reports.fixtures import FAIL_CELL, HOSTILE_REASON, PERF_CELL, cpu_run, gpu_run


@pytest.fixture(scope="module")
def doc() -> compat.Compat:
    merged = merge([(Path("cpu/results.json"), cpu_run()), (Path("gpu/results.json"), gpu_run())])
    return compat.build(merged, generated_at="2026-11-30T12:00:00Z")


@pytest.fixture(scope="module")
def page(doc: compat.Compat) -> str:
    return html.render(doc)


def data_block(page: str) -> dict[str, Any]:
    match = re.search(r'<script type="application/json" id="opgate-data">(.*?)</script>', page, re.DOTALL)
    assert match is not None
    data: dict[str, Any] = json.loads(match.group(1))
    return data


def test_data_block_cannot_be_closed_by_data(page: str, doc: compat.Compat) -> None:
    assert page.count("</script>") == 2  # the data block and the code block, nothing from the data
    assert "<!--" not in page
    data = data_block(page)
    fail = next(c for c in data["cells"] if c["id"] == FAIL_CELL)
    assert HOSTILE_REASON in fail["reason"]  # round-trips exactly
    assert data == json.loads(json.dumps(html.page_data(doc)))


@pytest.mark.parametrize("text", ["</script>", "<!--", "\u2028\u2029", "a&b<c>d", "</SCRIPT >"])
def test_embed_json_round_trips(text: str) -> None:
    embedded = html.embed_json({"t": text})
    assert "<" not in embedded
    assert ">" not in embedded
    assert "\u2028" not in embedded
    assert json.loads(embedded) == {"t": text}


def test_page_is_self_contained(page: str) -> None:
    assert "default-src 'none'" in page
    assert not re.search(r'(src|href)\s*=\s*["\']?(https?:)?//', page)
    assert "@import" not in page
    assert "fetch(" not in page
    assert "XMLHttpRequest" not in page


def test_cell_evidence_is_all_there(page: str) -> None:
    data = data_block(page)
    fail = next(c for c in data["cells"] if c["id"] == FAIL_CELL)
    assert fail["verdict"] == "fail"
    assert fail["bucket"] == "fail"
    assert fail["repro"].startswith("opgate run --select")
    assert fail["checks"][0]["name"] == "correctness"
    assert fail["checks"][0]["details"]["max_abs_err"] == 0.31
    assert fail["kernels"] == ["opgate::rms_norm"]
    assert {c["label"] for c in data["columns"]} >= {"pt2.13 cpu", "pt2.11 cu13.0 sm_90 (H200)"}
    assert len(data["cells"]) == len(cpu_run().cells) + len(gpu_run().cells)


def test_perf_charts_are_inline_svg(page: str, doc: compat.Compat) -> None:
    perf = page.split('<section id="perf">', 1)[1]
    assert perf.count("<svg") == 1  # one bar chart for rms_norm, no history yet
    assert "32768x8192" in perf
    assert "% of roofline" in perf
    newest = next(s for s in doc.perf["series"] if s["cell"] == PERF_CELL and s["shape"] == "32768x8192")
    assert f">{newest['runs'][-1]['gbps']:.0f}<" in perf


def test_page_without_perf_says_why() -> None:
    merged = merge([(Path("cpu/results.json"), cpu_run())])
    page = html.render(compat.build(merged, generated_at="2026-11-30T12:00:00Z"))
    assert "perf is measured on GPU cells only" in page
