"""Verdict stability across runs: identical cells counted, changed and missing cells listed, closest calls."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from opgate.matrix.cell import Cell
from opgate.reports.stability import compare, main, margin
from opgate.validators.result import CellResult, CheckResult, RunResults, Verdict

ROOT = Path(__file__).resolve().parent.parent


def cell(op: str, dtype: str = "bf16") -> Cell:
    return Cell(
        op=op, impl="liger", torch="2.11.0", cuda="13.0", arch="sm_90",
        dtype=dtype, layout="contiguous", mode="eager", shapes="default",
    )  # fmt: skip


def result(c: Cell, verdict: str, op_ulps: float, seed: int) -> CellResult:
    comp = {"op_ulps": op_ulps, "allowed_ulps": 3.0, "problem": "", "op_nonfinite": 0}
    status = Verdict(verdict if verdict in ("pass", "fail") else "pass")
    check = CheckResult("correctness", status, f"err {op_ulps} ulp", {"comparisons": [comp]})
    return CellResult(c, Verdict(verdict), {}, [check], seed=seed, reason="" if verdict == "pass" else "x")


def write_runs(tmp_path: Path, runs: list[list[CellResult]]) -> list[Path]:
    dirs = []
    for i, cells in enumerate(runs, 1):
        d = tmp_path / f"run{i}"
        RunResults(cells, {}).write(d / "results.json")
        dirs.append(d)
    return dirs


def test_identical_runs(tmp_path: Path) -> None:
    a, b = cell("liger_rms_norm"), cell("liger_swiglu")
    runs = write_runs(tmp_path, [[result(a, "pass", 1.4, s), result(b, "fail", 9.0, s)] for s in (1, 2, 3)])
    stab = compare(runs)
    doc = stab.to_json()
    assert (doc["cells"], doc["identical"], doc["changed"]) == (2, 2, 0)
    assert doc["verdicts"] == [{"fail": 1, "pass": 1}] * 3
    assert doc["closest_calls"] == [{"id": a.id, "margin": 1.4 / 3.0}]  # failing cells are not "close calls"
    assert main([*map(str, runs), "--out", str(tmp_path / "out")]) == 0
    assert "2 of 2 cells identical; 0 changed." in (tmp_path / "out" / "stability.md").read_text()


def test_a_flipped_or_missing_cell_is_listed_with_its_seeds(tmp_path: Path) -> None:
    a, b = cell("liger_rms_norm"), cell("liger_rope")
    runs = write_runs(
        tmp_path,
        [
            [result(a, "pass", 2.9, 11), result(b, "pass", 1.0, 11)],
            [result(a, "fail", 3.1, 12), result(b, "pass", 1.0, 12)],
            [result(a, "pass", 2.8, 13)],
        ],
    )
    doc = compare(runs).to_json()
    assert (doc["identical"], doc["changed"]) == (0, 2)
    flips = doc["changes"][a.id]
    assert [r["verdict"] for r in flips] == ["pass", "fail", "pass"]
    assert [r["seed"] for r in flips] == [11, 12, 13]
    assert doc["changes"][b.id][2] is None
    out = tmp_path / "out"
    assert main([*map(str, runs), "--out", str(out)]) == 1
    assert json.loads((out / "stability.json").read_text())["changed"] == 2
    md = (out / "stability.md").read_text()
    assert f"`{a.id}`" in md
    assert "absent" in md


def test_margin_is_the_worst_numeric_comparison() -> None:
    r = result(cell("x"), "pass", 1.5, 1)
    r.checks.append(
        CheckResult("gradients", Verdict.PASS, "", {"comparisons": [{"op_ulps": 2.4, "allowed_ulps": 3.0}]})
    )
    assert margin(r) == 2.4 / 3.0
    assert margin(CellResult(cell("y"), Verdict.SKIP, {})) is None


def test_margin_counts_the_absolute_floor_a_comparison_passes_by() -> None:
    """float32 layer_norm on the H200: 11.9 of 12.1 ulps allowed, but 1.6e-6 of a 2e-5 floor."""
    comp = {"op_ulps": 11.93, "allowed_ulps": 12.11, "op_err": 1.64e-6, "allowed": 2e-5}
    r = CellResult(
        cell("f"), Verdict.PASS, {}, [CheckResult("correctness", Verdict.PASS, "", {"comparisons": [comp]})]
    )
    assert margin(r) == 1.64e-6 / 2e-5
    tight = {**comp, "op_err": 1.9e-5}  # near both bounds: near flipping
    r2 = CellResult(
        cell("g"), Verdict.PASS, {}, [CheckResult("correctness", Verdict.PASS, "", {"comparisons": [tight]})]
    )
    assert margin(r2) == 1.9e-5 / 2e-5


@pytest.mark.integration
def test_unreadable_results_and_usage(tmp_path: Path) -> None:
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "results.json").write_text("{}")
    good = write_runs(tmp_path, [[result(cell("a"), "pass", 1.0, 1)]])[0]
    cmd = [sys.executable, "-m", "opgate.reports.stability", str(good), str(tmp_path / "bad"), "--out", "o"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 7
    assert "Traceback" not in proc.stderr
    assert "results" in proc.stderr
    one = subprocess.run([*cmd[:4], "--out", "o"], cwd=tmp_path, capture_output=True, text=True, check=False)
    assert one.returncode == 2
