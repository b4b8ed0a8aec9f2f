"""compat.md: the release-notes table, checked against counts taken straight from the fixtures."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from opgate.reports import compat, markdown
from opgate.reports.merge import merge
from opgate.validators.result import RunResults, Verdict
from tests.data.reports.fixtures import (
    ERROR_CELL,
    FAIL_CELL,
    FALLBACK_CELL,
    UNSUPPORTED_CELL,
    cpu_run,
    gpu_run,
)

BUCKET = {"pass": "✅", "fallback": "⚠️", "fail": "❌", "error": "❌", "flaky": "❌", "skip": "–"}


def render(*runs: RunResults) -> str:
    merged = merge((Path(f"run{i}/results.json"), run) for i, run in enumerate(runs))
    return markdown.render(compat.build(merged, generated_at="2026-11-30T12:00:00Z"))


@pytest.fixture(scope="module")
def md() -> str:
    return render(cpu_run(), gpu_run())


def table_row(md: str, first_cell: str, after: str = "## Summary") -> list[str]:
    section = md.split(after, 1)[1]
    line = next(line for line in section.splitlines() if line.startswith(f"| {first_cell} |"))
    return [c.strip() for c in line.strip("|").split(" | ")]


def expected_counts(runs: list[RunResults], op: str, column: tuple[str, str]) -> str:
    """Independent count: cells of one op in one (torch prefix, device part) column."""
    counter: Counter[str] = Counter()
    for run in runs:
        for cell in run.cells:
            torch_prefix, device = column
            if cell.cell.op == op and cell.cell.torch.startswith(torch_prefix) and cell.cell.id.count(device):
                counter[BUCKET.get(cell.verdict.value, "🚫")] += 1
    parts = [f"{icon} {counter[icon]}" for icon in ("✅", "⚠️", "❌", "–")]
    if counter["🚫"]:
        parts.append(f"🚫 {counter['🚫']}")
    return " · ".join(parts)


def test_legend_distinguishes_binary_from_gpu(md: str) -> None:
    assert "**Legend**" in md
    legend = md.split("**Legend**", 1)[1].split("## Summary", 1)[0].replace("\n", " ")
    assert "*ran on that GPU*" in legend
    assert '"(binary only)"' in legend
    assert "*verified in the binary* only" in legend
    header = table_row(md, "op / implementation")
    assert header == [
        "op / implementation",
        "pt2.11 cu13.0 sm_90 (H200)",
        "pt2.13 cpu",
        "pt2.13 cu13.0 sm_80 (binary only)",
        "pt2.13 cu13.0 sm_90 (binary only)",
    ]


def test_summary_counts_match_the_results(md: str) -> None:
    runs = [cpu_run(), gpu_run()]
    row = table_row(md, "rms_norm/triton")
    assert row[1] == expected_counts(runs, "rms_norm", ("2.11", "-sm_90-"))
    assert row[2] == expected_counts(runs, "rms_norm", ("2.13", "-cpu-"))
    assert row[3] == expected_counts(runs, "rms_norm", ("2.13", "-sm_80-"))
    assert row[2] == "✅ 16 · ⚠️ 1 · ❌ 1 · – 0"
    silu = table_row(md, "silu_mul/triton")
    assert silu[1] == ""  # no silu_mul on the H200
    assert (
        silu[2] == expected_counts(runs, "silu_mul", ("2.13", "-cpu-")) == "✅ 22 · ⚠️ 0 · ❌ 1 · – 0 · 🚫 1"
    )


def test_per_op_tables(md: str) -> None:
    assert "## rms_norm/triton" in md
    assert "## silu_mul/triton" in md
    compile_bf16 = table_row(md, "compile · bf16", after="## rms_norm/triton")
    assert compile_bf16[1:3] == ["✅ 2", "✅ 2 · ⚠️ 1"]
    build = table_row(md, "build · all", after="## rms_norm/triton")
    assert build[1:] == ["✅ 1", "", "✅ 1", "✅ 1"]


def test_non_pass_list_has_every_bad_cell_with_its_reason(md: str) -> None:
    listing = md.split("## Cells that did not pass", 1)[1]
    for cell in (FAIL_CELL, FALLBACK_CELL, ERROR_CELL, UNSUPPORTED_CELL):
        assert f"`{cell}`" in listing
    assert "worker killed by SIGSEGV" in listing
    assert "4 cell(s): no sm_80 device here" in listing
    # Markup in a reason is neutralised: it must not open an HTML comment or a script in the notes.
    assert "<!--" not in md
    assert "<script>" not in md
    assert "&lt;/script&gt;&lt;script&gt;window.__pwned=1" in listing


def test_gpu_column_with_runtime_cells_names_the_gpu_not_binary() -> None:
    md = render(gpu_run())
    assert "pt2.11 cu13.0 sm_90 (H200)" in md
    assert "binary only" not in md.split("**Legend**")[0]
    only_skips = cpu_run()
    only_skips.cells = [c for c in only_skips.cells if c.cell.arch == "sm_80" and c.verdict is Verdict.SKIP]
    assert "pt2.13 cu13.0 sm_80 (not run)" in render(only_skips)


def test_pipes_in_reasons_do_not_break_rows() -> None:
    run = cpu_run({FAIL_CELL: (Verdict.FAIL, "a | b\nc")})
    md = render(run)
    line = next(line for line in md.splitlines() if f"`{FAIL_CELL}`" in line)
    assert line.endswith("a \\| b c")


def test_all_pass_says_so() -> None:
    run = cpu_run({FAIL_CELL: (Verdict.PASS, ""), FALLBACK_CELL: (Verdict.PASS, "")})
    run.cells = [c for c in run.cells if c.cell.op == "rms_norm" and c.cell.arch == "cpu"]
    assert "Every cell passed." in render(run)
