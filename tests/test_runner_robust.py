"""Runs under stress: two runs on one ``--out``, a run interrupted or killed, a runaway cell.

Real ``opgate run`` processes on the planted ops of tests/fixtures_runner:
``fx_hang``'s float16 cell hangs until its 4 s timeout, which keeps a run busy
long enough to start a second one against it, or to interrupt it with one
cell finished and two not.  ``mem_hog``'s float16 cell allocates without
bound under a 768 MiB limit (tests/fixtures_runner/matrix_memory.yaml).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from opgate.matrix.errors import BusyOutput, CellsFailed, Interrupted, MissingShard
from opgate.reports.__main__ import main as reports_main
from opgate.validators.result import RunResults, Verdict
from tests.test_runner_isolation import CONFIG, FIXTURES, ROOT, cell_id

pytestmark = pytest.mark.slow
HANG = ("--select", "fx_hang.*-cpu-*")  # bf16 passes, fp16 hangs to its timeout, fp32 passes


def start(out: Path, *args: str, config: Path = CONFIG) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "opgate.validators", "run", "--config", str(config)]
    argv += [
        "--ops-path",
        str(FIXTURES),
        "--out",
        str(out),
        "--no-progress",
        "--no-cache",
        "--jobs",
        "1",
        *args,
    ]
    env = {**os.environ, "OPGATE_CACHE": str(out.parent / "cache")}
    return subprocess.Popen(
        argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def wait_for(predicate: object, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def finished_cells(out: Path) -> set[str]:
    return {p.stem for p in (out / "cells").glob("*.json")}


def assert_complete(out: Path) -> RunResults:
    run = RunResults.read(out / "results.json")
    ids = {c.id for c in run.cells}
    assert run.planned == 3
    assert run.missing == []
    assert ids == {cell_id("fx_hang", d) for d in ("bf16", "fp16", "fp32")}
    assert finished_cells(out) == ids
    return run


def test_two_runs_started_together_on_one_out_lose_no_verdict(tmp_path: Path) -> None:
    out = tmp_path / "shared"
    procs = [start(out, *HANG), start(out, *HANG)]
    results = [(p.wait(timeout=300), *p.communicate()) for p in procs]
    codes = sorted(code for code, _, _ in results)
    assert codes == [CellsFailed.exit_code, BusyOutput.exit_code], results
    loser = next(err for code, _, err in results if code == BusyOutput.exit_code)
    assert "another opgate run is writing there (pid " in loser
    assert "Traceback" not in loser
    assert_complete(out)


def test_a_second_run_on_a_busy_out_is_refused_and_keeps_the_first_runs_cells(tmp_path: Path) -> None:
    out = tmp_path / "shared"
    first = start(out, *HANG)
    wait_for(lambda: cell_id("fx_hang", "bf16") in finished_cells(out))  # one verdict in, one cell hanging
    second = start(out, *HANG)
    assert second.wait(timeout=120) == BusyOutput.exit_code
    assert "another opgate run is writing there" in second.communicate()[1]
    assert cell_id("fx_hang", "bf16") in finished_cells(out)  # not wiped
    assert first.wait(timeout=300) == CellsFailed.exit_code
    run = assert_complete(out)
    assert {c.id: c.verdict for c in run.cells}[cell_id("fx_hang", "fp16")] is Verdict.ERROR
    again = start(out, "--select", "fx_hang.*-cpu-bf16-*")  # the folder is free again
    assert again.wait(timeout=300) == 0


def digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def publish(*argv: str) -> int:
    return reports_main(["publish", *argv])


def test_interrupted_run_exits_130_and_publishes_only_as_incomplete(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, report = tmp_path / "run", tmp_path / "report"
    proc = start(out, *HANG, "--retries", "0")
    wait_for(lambda: cell_id("fx_hang", "bf16") in finished_cells(out))
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == Interrupted.exit_code
    err = proc.communicate()[1]
    assert "interrupted: 1 finished cells" in err
    assert "2 planned cell(s) missing" in err
    assert "Traceback" not in err
    run = RunResults.read(out / "results.json")
    assert run.planned == 3
    assert run.missing == [cell_id("fx_hang", "fp16"), cell_id("fx_hang", "fp32")]

    capsys.readouterr()
    assert publish("--in", str(out), "--out", str(report)) == 0
    assert "INCOMPLETE: 2 planned cell(s) have no verdict" in capsys.readouterr().out
    assert json.loads((report / "compat.json").read_text())["missing"] == run.missing
    assert "**INCOMPLETE:**" in (report / "compat.md").read_text()
    assert 'class="incomplete"' in (report / "index.html").read_text()
    before = digest(report)
    assert publish("--in", str(out), "--out", str(report), "--strict") == MissingShard.exit_code
    assert "refusing to publish (--strict): INCOMPLETE" in capsys.readouterr().err
    assert digest(report) == before


def test_an_interrupted_run_keeps_the_cells_it_skipped_at_plan_time(tmp_path: Path) -> None:
    """The GPU cells of a CPU machine are known skips from the plan: an interrupted run still
    records them (one file), so only the cells it did not finish are missing."""
    out = tmp_path / "run"
    proc = start(out, "--select", "fx_hang.*", "--retries", "0")
    wait_for(lambda: cell_id("fx_hang", "bf16") in finished_cells(out))
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == Interrupted.exit_code
    assert "Traceback" not in proc.communicate()[1]
    run = RunResults.read(out / "results.json")
    skipped = [c for c in run.cells if c.verdict is Verdict.SKIP]
    assert len(skipped) == 3
    assert all("-sm_90-" in c.id for c in skipped)
    assert run.missing == [cell_id("fx_hang", "fp16"), cell_id("fx_hang", "fp32")]
    assert run.planned == 6


def test_killed_run_leaves_no_results_until_collected_and_then_says_what_is_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    done = start(out, "--select", "fx_hang.*-cpu-bf16-*")  # a finished run's results.json ...
    assert done.wait(timeout=300) == 0
    proc = start(out, *HANG, "--retries", "0")  # ... is not left behind by the next, killed, run
    wait_for(lambda: (out / "planned.json").exists() and not (out / "results.json").exists())
    wait_for(lambda: cell_id("fx_hang", "bf16") in finished_cells(out))
    proc.kill()  # SIGKILL: no handler runs; its workers die with it (PR_SET_PDEATHSIG)
    proc.wait(timeout=60)
    capsys.readouterr()
    assert publish("--in", str(out), "--out", str(tmp_path / "r")) == 7
    assert "no results file" in capsys.readouterr().err
    from opgate.validators.__main__ import main as validators_main

    assert validators_main(["collect", "--out", str(out)]) == 0
    assert "incomplete: 2 planned cell(s) did not finish" in capsys.readouterr().err
    assert publish("--in", str(out), "--out", str(tmp_path / "r"), "--strict") == MissingShard.exit_code


def test_runaway_cell_is_an_error_naming_the_limit_and_its_neighbour_passes(tmp_path: Path) -> None:
    out = tmp_path / "mem"
    proc = start(out, "--retries", "0", config=FIXTURES / "matrix_memory.yaml")
    code = proc.wait(timeout=300)
    assert code == CellsFailed.exit_code, proc.communicate()
    cells = {c.cell.dtype: c for c in RunResults.read(out / "results.json").cells}
    assert cells["fp32"].verdict is Verdict.PASS  # the default limit does not false-alarm
    hog = cells["fp16"]
    assert hog.verdict is Verdict.ERROR
    assert hog.reason.startswith("memory limit: the cell needed more than 768 MiB")
    assert "RLIMIT_DATA" in hog.reason
