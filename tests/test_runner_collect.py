"""An interrupted run keeps its finished verdicts: ``collect`` rebuilds results.json from cells/."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from junitparser import JUnitXml

from opgate.matrix.cell import Cell
from opgate.validators.result import CellResult, CheckResult, RunResults, Verdict

REPO = Path(__file__).resolve().parent.parent


def _record(layout: str, verdict: Verdict) -> CellResult:
    cell = Cell("rms_norm", "triton", "2.13.0", "none", "cpu", "fp32", layout, "eager")
    check = CheckResult("correctness", verdict, f"{verdict.value} on {layout}")
    return CellResult(cell, verdict, {"torch": "2.13.0", "python": "3.11"}, [check], seed=7)


@pytest.mark.integration
def test_collect_writes_results_and_junit_from_finished_cells(tmp_path: Path) -> None:
    (tmp_path / "cells").mkdir()
    for rec in (_record("contiguous", Verdict.PASS), _record("strided", Verdict.FAIL)):
        (tmp_path / "cells" / f"{rec.id}.json").write_text(json.dumps(rec.to_json()))
    proc = subprocess.run(
        [sys.executable, "-m", "opgate.validators", "collect", "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    run = RunResults.read(tmp_path / "results.json")
    assert {c.id: c.verdict for c in run.cells} == {
        "rms_norm.triton-pt2.13-cpu-fp32-contiguous-eager": Verdict.PASS,
        "rms_norm.triton-pt2.13-cpu-fp32-strided-eager": Verdict.FAIL,
    }
    assert run.env["torch"] == "2.13.0"
    assert "collected" in run.argv[-1]
    cases = [case for suite in JUnitXml.fromfile(str(tmp_path / "junit.xml")) for case in suite]
    assert sorted(c.name for c in cases) == sorted(c.id for c in run.cells)


@pytest.mark.integration
def test_collect_refuses_an_empty_run(tmp_path: Path) -> None:
    (tmp_path / "cells").mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "opgate.validators", "collect", "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 7
    assert "no finished cell records" in proc.stderr
    assert not (tmp_path / "results.json").exists()


def test_collect_reads_the_skipped_cells_written_in_one_file(tmp_path: Path) -> None:
    """The plan's skips are one ``cells/skipped.jsonl`` (most of a CPU machine's matrix), not a file each."""
    from opgate.validators.collect import SKIPPED_FILE, collect

    (tmp_path / "cells").mkdir()
    ran = _record("contiguous", Verdict.PASS)
    (tmp_path / "cells" / f"{ran.id}.json").write_text(json.dumps(ran.to_json()))
    gpu = Cell("rms_norm", "triton", "2.13.0", "13.0", "sm_90", "fp32", "contiguous", "eager")
    skipped = [CellResult(gpu, Verdict.SKIP, ran.env, reason="no sm_90 device here")]
    (tmp_path / "cells" / SKIPPED_FILE).write_text("".join(json.dumps(r.to_json()) + "\n" for r in skipped))
    run = collect(tmp_path)
    assert {c.id: c.verdict for c in run.cells} == {ran.id: Verdict.PASS, gpu.id: Verdict.SKIP}
    assert run.cells[[c.id for c in run.cells].index(gpu.id)].reason == "no sm_90 device here"


def _crashed(impl: str, layout: str = "contiguous") -> CellResult:
    cell = Cell("rms_norm", impl, "2.11.0", "13.0", "sm_90", "bf16", layout, "aoti")
    return CellResult(cell, Verdict.ERROR, {"torch": "2.11.0"}, [], reason="worker killed by SIGSEGV")


def test_collect_compares_cut_cells_with_their_finished_controls(tmp_path: Path) -> None:
    """A run cut short before its end still tells a broken mode from a broken op."""
    from opgate.validators.collect import collect

    (tmp_path / "cells").mkdir()
    (tmp_path / "controls").mkdir()
    op, control = _crashed("triton"), _crashed("control")
    other = CellResult(
        Cell("silu_mul", "triton", "2.11.0", "13.0", "sm_90", "bf16", "contiguous", "aoti"),
        Verdict.ERROR, {"torch": "2.11.0"}, [], reason="worker killed by SIGSEGV",
    )  # fmt: skip
    for rec, folder in ((op, "cells"), (other, "cells"), (control, "controls")):
        (tmp_path / folder / f"{rec.id}.json").write_text(json.dumps(rec.to_json()))
    run = collect(tmp_path)
    by_id = {c.id: c for c in run.cells}
    linked = by_id[op.id]
    assert linked.verdict is Verdict.ENVIRONMENT
    assert control.id in linked.reason
    assert linked.check("control") is not None
    assert by_id[other.id].verdict is Verdict.ERROR  # its control never finished: its own verdict stands
    assert by_id[other.id].check("control") is None
    again = collect(tmp_path)  # collecting twice changes nothing
    assert [c.to_json() for c in again.cells] == [c.to_json() for c in run.cells]
