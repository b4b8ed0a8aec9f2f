"""The worth-it verdict in compat.md and index.html: a slower op is flagged, as perf, not as a failure."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from opgate.reports import compat, html, markdown
from opgate.reports.merge import merge
from opgate.validators.perf.worth import cell_finding, judge_row
from opgate.validators.result import CheckResult, RunResults, Verdict
from tests.data.reports.fixtures import gpu_run


def _samples(center: float, rng: random.Random) -> list[float]:
    return [center * (1.0 + rng.gauss(0.0, 0.01)) for _ in range(30)]


def _worth(mode: str, op_us: float, baselines: dict[str, float], seed: int) -> CheckResult:
    """The perf check's record as perf_worth writes it, judged by the real rule."""
    rng = random.Random(seed)
    rows = []
    for shape in ([4096, 4096], [32768, 8192]):
        scale = shape[0] / 4096
        row = judge_row(
            _samples(op_us * scale, rng), {n: _samples(us * scale, rng) for n, us in baselines.items()}
        )
        rows.append({"shape": shape, "direction": "forward", **row})
    record: dict[str, Any] = {
        "mode": mode,
        "context": "producer/consumer graph",
        "baselines": list(baselines),
        "rows": rows,
    }
    record["summary"] = cell_finding(rows)
    return CheckResult("perf", Verdict.PASS, "timed", {"shapes": [], "worth_it": record})


def _run() -> RunResults:
    """The fixture H200 run with worth-it records: eager wins, compile loses 2x, cudagraphs on par."""
    import dataclasses

    run = gpu_run()
    eager = next(
        r
        for r in run.cells
        if r.cell.mode == "eager" and r.cell.dtype == "bf16" and r.cell.layout == "contiguous"
    )
    graphs = dataclasses.replace(eager, cell=dataclasses.replace(eager.cell, mode="cudagraphs"), checks=[])
    run.cells.append(graphs)
    planted = {
        "eager": ({"reference": 3322.0, "aten": 399.1, "compile(reference)": 461.8}, 265.7),
        "compile": ({"compile(reference)": 252.4}, 518.1),
        "cudagraphs": ({"compile(reference)": 250.0}, 255.0),
    }
    for i, result in enumerate(run.cells):
        cell = result.cell
        if cell.dtype == "bf16" and cell.layout == "contiguous" and cell.mode in planted:
            baselines, op_us = planted[cell.mode]
            result.checks = [c for c in result.checks if c.name != "perf"]
            result.checks.append(_worth(cell.mode, op_us, baselines, seed=i))
    return run


def _compat() -> compat.Compat:
    merged = merge([(Path("gpu/results.json"), _run())])
    return compat.build(merged, generated_at="2026-12-01T12:00:00Z")


def test_compat_md_flags_the_mode_where_pytorch_is_faster() -> None:
    md = markdown.render(_compat())
    section = md.split("## Worth it? The op against PyTorch in the same mode", 1)[1].split("\n## ", 1)[0]
    row = next(line for line in section.splitlines() if line.startswith("| rms_norm/triton |"))
    eager, comp, graphs = (c.strip() for c in row.strip("|").split(" | ")[1:])
    assert eager.startswith("0.67x aten, faster")
    assert comp == "**2.05x compile(reference), slower**"
    assert graphs.startswith("1.02x compile(reference), par")
    assert "- `rms_norm/triton` in compile (pt2.11 cu13.0 sm_90): 2.05x compile(reference), slower" in section
    assert any(f"slower at {shape} forward" in section for shape in ("4096x4096", "32768x8192"))
    # a perf finding, never a failure: the correctness summary still counts every cell as passing
    summary = md.split("## Summary", 1)[1].split("\n## ", 1)[0]
    assert "❌ 0" in summary


def test_index_html_has_the_same_verdicts() -> None:
    page = html.render(_compat())
    assert '<section id="worth">' in page
    assert 'class="worth-slower"' in page
    assert "2.05x compile(reference), slower" in page
    assert 'class="worth-faster"' in page


def test_no_timed_cells_no_section() -> None:
    merged = merge([(Path("gpu/results.json"), gpu_run())])
    built = compat.build(merged, generated_at="2026-12-01T12:00:00Z")
    assert "Worth it?" not in markdown.render(built)
    assert '<section id="worth">' not in html.render(built)
