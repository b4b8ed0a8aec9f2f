"""index.html without a browser: no verdicts inside, data from compat.json, layout block safe, perf honest."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from opgate.matrix.cell import MODES
from opgate.reports import charts, compat, html
from opgate.reports.merge import merge
from opgate.reports.perf import MIN_ROOFLINE_US, roofline_shown, series_from_results
from opgate.reports.view import cell_url
from opgate.validators.result import CheckResult, Verdict
from tests.data.reports.fixtures import (
    FAIL_CELL,
    H200_ENV,
    PERF_CELL,
    cpu_run,
    gpu_run,
)


@pytest.fixture(scope="module")
def doc() -> compat.Compat:
    merged = merge([(Path("cpu/results.json"), cpu_run()), (Path("gpu/results.json"), gpu_run())])
    return compat.build(merged, generated_at="2026-11-30T12:00:00Z")


@pytest.fixture(scope="module")
def page(doc: compat.Compat) -> str:
    return html.render(doc)


def layout_block(page: str) -> dict[str, Any]:
    match = re.search(r'<script type="application/json" id="opgate-layout">(.*?)</script>', page, re.DOTALL)
    assert match is not None
    data: dict[str, Any] = json.loads(match.group(1))
    return data


def test_the_page_holds_no_verdicts_and_reads_compat_json_beside_it(page: str, doc: compat.Compat) -> None:
    assert not any(e.result.id in page for e in doc.entries), "cell records belong in compat.json"
    assert "correctness" not in page.split("<script>", 1)[0]
    layout = layout_block(page)
    assert layout["data"] == "compat.json"
    assert "fetch(LAYOUT.data" in page
    assert layout["cells"] == len(doc.entries)
    assert layout["generated_at"] == doc.generated_at


def test_the_page_stays_small_however_many_cells(doc: compat.Compat) -> None:
    big = compat.Compat(doc.generated_at, doc.environments, doc.entries * 40, doc.perf)
    assert len(html.render(big)) < len(html.render(doc)) + 2_000
    assert len(html.render(doc).encode()) < 120_000


def test_only_the_own_folder_can_be_reached(page: str) -> None:
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page)
    assert csp is not None
    assert "default-src 'none'" in csp[1]
    assert "connect-src 'self'" in csp[1]
    assert not re.search(r'(src|href)\s*=\s*["\']?(https?:)?//', page)
    assert "@import" not in page
    assert "XMLHttpRequest" not in page


def test_layout_says_what_only_python_knows(page: str, doc: compat.Compat) -> None:
    layout = layout_block(page)
    assert {c["label"] for c in layout["columns"]} >= {"pt2.13 cpu", "pt2.11 cu13.0 sm_90 (H200)"}
    for entry in doc.entries:
        cell = entry.result.cell
        assert f"{cell.torch}|{cell.cuda}|{cell.arch}" in layout["column_of"]
    assert set(layout["buckets"]) == {v.value for v in Verdict}
    assert "modes" not in layout  # mode facts travel with the data (compat.json "modes"), not the page
    assert layout["anchor"] + FAIL_CELL == cell_url("x.html", FAIL_CELL).split("#", 1)[1]


def test_compat_json_carries_the_mode_table(doc: compat.Compat) -> None:
    """The dashboard orders and describes modes from the published JSON: the one table, in order."""
    published = doc.to_json()["modes"]
    assert [m["name"] for m in published] == list(MODES)
    assert all(m["summary"] and m["name"] in MODES for m in published)
    assert {m["name"] for m in published if m["gpu_only"]} == {"cudagraphs", "build"}
    compat.validate_document(doc.to_json(), "compat.json")


def test_layout_block_cannot_be_closed_by_data() -> None:
    hostile = {**H200_ENV, "gpu_name": "</script><script>window.__pwned=1</script> <!--"}
    run = gpu_run()
    for cell in run.cells:
        cell.env = hostile
    merged = merge([(Path("gpu/results.json"), run)])
    page = html.render(compat.build(merged, generated_at="2026-11-30T12:00:00Z"))
    assert page.count("</script>") == 2  # the layout block and the code block, nothing from the data
    assert "<!--" not in page.split("<script", 1)[1]
    assert hostile["gpu_name"] in json.dumps(layout_block(page))


@pytest.mark.parametrize("text", ["</script>", "<!--", "\u2028\u2029", "a&b<c>d", "</SCRIPT >"])
def test_embed_json_round_trips(text: str) -> None:
    embedded = html.embed_json({"t": text})
    assert "<" not in embedded
    assert ">" not in embedded
    assert "\u2028" not in embedded
    assert json.loads(embedded) == {"t": text}


def test_cell_url_is_stable_and_escaped() -> None:
    assert cell_url("https://o.github.io/r/", FAIL_CELL) == f"https://o.github.io/r/#cell={FAIL_CELL}"
    assert (
        cell_url("https://o.github.io/r/index.html#cell=old", "a b")
        == "https://o.github.io/r/index.html#cell=a%20b"
    )


def test_perf_charts_are_inline_svg(page: str, doc: compat.Compat) -> None:
    perf = page.split('<section id="perf">', 1)[1]
    assert perf.count("<svg") == 1  # one bar chart for rms_norm, no history yet
    assert "32768x8192" in perf
    assert "% of roofline" in perf
    newest = next(s for s in doc.perf["series"] if s["cell"] == PERF_CELL and s["shape"] == "32768x8192")
    assert f">{newest['runs'][-1]['gbps']:.0f}<" in perf
    assert "n/a (shape too small)" not in perf  # 64 MB and 1 GB moved: tens of us and more


def _tiny_shape_series(nbytes: float, median_us: float) -> list[dict[str, Any]]:
    result = gpu_run().cells[0]
    result.checks = [
        CheckResult(
            "perf",
            Verdict.PASS,
            "measured",
            {
                "points": [
                    {
                        "shape": [8, 4096],
                        "bytes": nbytes,
                        "median_us": median_us,
                        "gbps": nbytes / median_us / 1e3,
                        "roofline_pct": 0.4,
                    }
                ],
                "ceilings": {"copy_gbps": 4274.0},
            },
        )
    ]
    return series_from_results([(result, "k", H200_ENV)], "2026-12-01T00:00:00Z")


def test_roofline_of_a_shape_too_small_to_tell_is_not_a_zero_bar() -> None:
    tiny = _tiny_shape_series(nbytes=2 * 8 * 4096 * 2, median_us=10.3)  # 131 kB: 0.03 us at 4274 GB/s
    (record,) = tiny[0]["runs"]
    assert record["ideal_us"] == pytest.approx(131072 / 4274e3)
    assert roofline_shown(record) is None
    svg = charts.bars("rms_norm", tiny)
    assert "n/a (shape too small)" in svg
    assert 'class="bar-roof"' not in svg
    assert ">0%<" not in svg

    # A shape whose traffic alone takes longer than a launch gets its bar.
    big = _tiny_shape_series(nbytes=MIN_ROOFLINE_US * 1.5 * 4274e3, median_us=40.0)
    assert roofline_shown(big[0]["runs"][0]) == pytest.approx(0.4)
    assert 'class="bar-roof"' in charts.bars("rms_norm", big)


def test_a_record_published_before_ideal_times_keeps_its_bar() -> None:
    assert roofline_shown({"run": "r", "median_us": 5.0, "roofline_pct": 3.0}) == 3.0
    assert roofline_shown({"run": "r", "median_us": 5.0}) is None


def test_page_without_perf_says_why() -> None:
    merged = merge([(Path("cpu/results.json"), cpu_run())])
    page = html.render(compat.build(merged, generated_at="2026-11-30T12:00:00Z"))
    assert "perf is measured on GPU cells only" in page
