"""Environment controls: a mode broken for the op's own reference does not blame the op.

Unit tests pin the comparison (:mod:`validators.controls`): only the same
failure (signal, timeout, the mode's own check) excuses a cell, never a
correctness failure, and a control that passes keeps the op's ``fail``.  The
end-to-end test plants an environment whose AOTInductor loader segfaults for
every package (tests/fixtures_runner/broken_aoti/sitecustomize.py, the H200
symptom) and runs the real runner: the correct op's aoti cell is
``environment`` with its control's reason, an op whose export fails on its own
keeps ``fail`` beside a passing control, the published table notes the broken
column, and the diff does not call it a regression.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from opgate.matrix.cell import Cell
from opgate.matrix.errors import ConfigError
from opgate.matrix.spec import load_spec
from opgate.reports import compat, diff
from opgate.reports.merge import merge, read_runs
from opgate.validators.controls import control_of, failure_kind, link
from opgate.validators.result import CellResult, CheckResult, RunResults, Verdict

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures_runner"
ZOO = ROOT / "tests" / "zoo"


def _cell(mode: str = "aoti", impl: str = "triton", layout: str = "transposed") -> Cell:
    return Cell("rms_norm", impl, "2.11.0", "13.0", "sm_90", "bf16", layout, mode)


def _result(cell: Cell, verdict: Verdict, reason: str = "", *checks: CheckResult) -> CellResult:
    return CellResult(cell, verdict, {}, list(checks), reason=reason)


def _crash(cell: Cell, signal: str = "SIGSEGV") -> CellResult:
    return _result(cell, Verdict.ERROR, f"worker killed by {signal} (same on re-run)")


def test_control_of_names_one_contiguous_reference_cell_per_group() -> None:
    control = control_of(_cell("aoti"))
    assert control is not None
    assert control.id == "rms_norm.control-pt2.11-cu13.0-sm_90-bf16-contiguous-aoti"
    assert control_of(_cell("aoti", impl="cuda", layout="strided")) == control  # one per op, not per impl
    assert control_of(_cell("eager")) is None  # nothing between an eager op and torch
    assert control_of(control) is None


def test_same_crash_becomes_environment_with_the_controls_reason() -> None:
    op, ctl = _crash(_cell()), _crash(control_of(_cell()))  # type: ignore[arg-type]
    linked = link(op, ctl)
    assert linked.verdict is Verdict.ENVIRONMENT
    assert not linked.verdict.is_bad
    assert (
        "rms_norm.control-pt2.11-cu13.0-sm_90-bf16-contiguous-aoti: worker killed by SIGSEGV" in linked.reason
    )
    assert "the op's own result: error" in linked.reason
    check = linked.check("control")
    assert check is not None
    assert check.status is Verdict.ENVIRONMENT
    assert check.details["same_failure"] is True


def test_same_mode_check_failure_is_the_environment() -> None:
    cell = _cell("export")
    mine = CheckResult("export", Verdict.FAIL, "torch.export failed: X")
    theirs = CheckResult("export", Verdict.FAIL, "torch.export failed: Y")
    linked = link(
        _result(cell, Verdict.FAIL, "export: torch.export failed: X", mine),
        _result(control_of(cell), Verdict.FAIL, "export: torch.export failed: Y", theirs),  # type: ignore[arg-type]
    )
    assert linked.verdict is Verdict.ENVIRONMENT
    assert failure_kind(linked) is None  # environment is not a failure


def test_a_passing_control_keeps_the_ops_fail() -> None:
    cell = _cell("export")
    op = _result(cell, Verdict.FAIL, "export: no fake impl", CheckResult("export", Verdict.FAIL, "no fake"))
    ctl = _result(control_of(cell), Verdict.PASS, "", CheckResult("export", Verdict.PASS, "ok"))  # type: ignore[arg-type]
    linked = link(op, ctl)
    assert linked.verdict is Verdict.FAIL
    assert linked.reason == op.reason
    check = linked.check("control")
    assert check is not None
    assert check.status is Verdict.PASS
    assert "the mode works in this environment" in check.summary


def test_different_failures_and_wrong_numbers_are_never_excused() -> None:
    cell = _cell("aoti")
    package = _result(cell, Verdict.FAIL, "aoti: package failed", CheckResult("aoti", Verdict.FAIL, "x"))
    assert link(package, _crash(control_of(cell))).verdict is Verdict.FAIL  # type: ignore[arg-type]
    wrong = CheckResult("correctness", Verdict.FAIL, "err 0.5")
    numbers = _result(cell, Verdict.FAIL, "", CheckResult("aoti", Verdict.PASS, "ok"), wrong)
    ctl = _result(control_of(cell), Verdict.FAIL, "", CheckResult("aoti", Verdict.PASS, "ok"), wrong)  # type: ignore[arg-type]
    assert link(numbers, ctl).verdict is Verdict.FAIL
    assert link(_crash(cell, "SIGABRT"), _crash(control_of(cell))).verdict is Verdict.ERROR  # type: ignore[arg-type]
    fallback = _result(cell, Verdict.FALLBACK, "", CheckResult("aoti", Verdict.FALLBACK, "traced through"))
    assert link(fallback, _crash(control_of(cell))).verdict is Verdict.FALLBACK  # type: ignore[arg-type]


def test_control_is_a_reserved_implementation_name(tmp_path: Path) -> None:
    text = (ZOO / "good" / "spec.yaml").read_text().replace("  triton:\n", "  control:\n")
    (tmp_path / "spec.yaml").write_text(text)
    with pytest.raises(ConfigError, match="reserved for opgate's environment controls"):
        load_spec(tmp_path / "spec.yaml", ZOO)


def _broken_aoti(out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    plant = FIXTURES / "broken_aoti"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(plant), os.environ.get("PYTHONPATH", "")]),
        "OPGATE_CACHE": str(out.parent / "cache"),
    }
    cmd = [
        sys.executable, "-m", "opgate.validators", "run", "--config", str(FIXTURES / "controls.yaml"),
        "--ops-path", str(ZOO), "--out", str(out), "--no-progress", "--retries", "1", *extra,
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert (out / "results.json").is_file(), proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def broken_aoti_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    out = tmp_path_factory.mktemp("broken-aoti") / "run"
    return out, _broken_aoti(out)  # a fresh cache: every cell runs


@pytest.mark.slow
def test_the_environment_verdict_is_served_from_the_cache_with_its_control(
    broken_aoti_run: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    """Nothing changed: the broken mode is not crashed into again, and its control is still listed."""
    first, _ = broken_aoti_run
    again = first.parent / "again"
    proc = _broken_aoti(again)
    run, record = RunResults.read(again / "results.json"), json.loads((again / "run.json").read_text())
    before = RunResults.read(first / "results.json")
    assert {c.id: c.verdict for c in run.cells} == {c.id: c.verdict for c in before.cells}
    aoti = next(c for c in run.cells if c.cell.op == "zoo_good" and c.cell.mode == "aoti")
    assert aoti.verdict is Verdict.ENVIRONMENT
    assert aoti.id in record["cached_cells"]
    assert [c.id for c in run.controls] == [c.id for c in before.controls]
    control = next(c for c in run.controls if c.verdict is Verdict.ERROR)
    assert control.id in record["cached_cells"]  # served beside the cell it explains, not re-run
    assert record["breakdown"]["cells_ran"] == 0
    assert proc.returncode == 1  # zoo_no_fake's own export failure, served from the cache too


@pytest.mark.slow
def test_a_mode_broken_for_the_reference_does_not_blame_the_op(
    broken_aoti_run: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    out, proc = broken_aoti_run
    run = RunResults.read(out / "results.json")
    aoti = next(c for c in run.cells if c.cell.op == "zoo_good" and c.cell.mode == "aoti")
    assert aoti.verdict is Verdict.ENVIRONMENT, aoti.reason
    assert "fails the same way" in aoti.reason
    assert "worker killed by SIGSEGV" in aoti.reason
    controls = {c.id: c for c in run.controls}
    control = controls[aoti.check("control").details["control"]]  # type: ignore[union-attr]
    assert control.cell.impl == "control"
    assert control.verdict is Verdict.ERROR
    assert "SIGSEGV" in control.reason
    # the control ran after the op's first crash, and crashed alike (twice: its own re-run), so
    # the op's cell was not re-run: a re-run of an environment's failure tells nothing
    assert (aoti.attempts, control.attempts) == (1, 2)
    # the converse: the op's own export failure stands beside a control that passes
    export = next(c for c in run.cells if c.cell.op == "zoo_no_fake" and c.cell.mode == "export")
    assert export.verdict is Verdict.FAIL
    assert export.check("control").status is Verdict.PASS  # type: ignore[union-attr]
    assert export.attempts == 2  # its control passed: the op's failure got its re-run, and stands
    good_export = next(c for c in run.cells if c.cell.op == "zoo_good" and c.cell.mode == "export")
    assert good_export.verdict is Verdict.PASS
    assert good_export.check("control") is None  # a passing group runs no control
    assert len(run.controls) == 2
    assert proc.returncode == 1  # zoo_no_fake's own failure; the environment cell is not bad
    assert "environment x1: aoti" in proc.stdout


@pytest.mark.slow
def test_the_broken_mode_is_a_column_note_and_not_a_regression(
    broken_aoti_run: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    out, _ = broken_aoti_run
    head = compat.build(merge(read_runs([out])))
    doc = json.loads(compat.dumps(head))  # validated against the schema on write
    assert [c["id"] for c in doc["controls"]] == sorted(c.result.id for c in head.controls)
    back = compat.from_document(doc, "roundtrip")
    assert {e.result.verdict for e in back.entries} == {Verdict.PASS, Verdict.FAIL, Verdict.ENVIRONMENT}
    from opgate.reports import html, markdown

    md = markdown.render(back)
    assert "🌐 aoti broken here" in md
    assert "## Environment notes" in md
    assert "worker killed by SIGSEGV" in md.split("## Environment notes", 1)[1]
    assert "aoti broken here" in html.render(back)
    # base: the same cells, every one passing -> the environment cell is reported, never a regression
    passing = [CellResult(e.result.cell, Verdict.PASS, e.result.env, reason="") for e in back.entries]
    base_run = RunResults(passing, env=dict(next(iter(back.environments.values()))))
    base_dir = tmp_path / "base"
    base_run.write(base_dir / "results.json")
    base = compat.build(merge(read_runs([base_dir])))
    changes = diff.compute(base, back).to_json()
    assert [c["head"] for c in changes["environment"]] == ["environment"]
    assert all(c["head"] != "environment" for c in changes["new_failures"] + changes["new_fallbacks"])
    assert [c["cell"] for c in changes["new_failures"]] == [
        c.result.id for c in back.entries if c.result.verdict is Verdict.FAIL
    ]
    from opgate.reports.alerts.message import from_diff

    alerted = {item.cell for item in from_diff(changes, "run-1", "").items}
    assert changes["environment"][0]["cell"] not in alerted
    assert alerted == {c["cell"] for c in changes["new_failures"]}
