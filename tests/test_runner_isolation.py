"""``opgate run`` end to end on the planted ops in tests/fixtures_runner.

Each planted op is a real op spec (``--ops-path``) whose kernel is correct
except on float16, where it segfaults, hangs, or (fx_flaky) returns wrong
numbers once per run; fx_killed's first worker is killed from outside.
Cells are sorted by id (bf16, fp16, fp32), so the faulty cell runs between
two good ones in the same reused worker: the good ones must keep their
``pass``, the bad one must name its signal or timeout.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from junitparser import Error, JUnitXml, Skipped

from opgate.matrix.errors import CellsFailed
from opgate.validators.result import RunResults, Verdict

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "fixtures_runner"
CONFIG = FIXTURES / "matrix.yaml"

pytestmark = pytest.mark.slow


def opgate_run(out: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """A real run of the planted ops, one host lane (the assertions follow its order); no cache."""
    argv = [
        sys.executable,
        "-m",
        "opgate.validators",
        "run",
        "--config",
        str(CONFIG),
        "--ops-path",
        str(FIXTURES),
    ]
    env = {"OPGATE_CACHE": str(out / "cache"), **(env or {})}
    return subprocess.run(
        [*argv, "--out", str(out), "--no-progress", "--no-cache", "--jobs", "1", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **env},
        check=False,
    )


def verdicts(out: Path) -> dict[str, str]:
    return {c.id: c.verdict.value for c in RunResults.read(out / "results.json").cells}


def run_record(out: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((out / "run.json").read_text())
    return data


def cell_id(op: str, dtype: str, impl: str = "native") -> str:
    return f"{op}.{impl}-pt{_torch_mm()}-cpu-{dtype}-contiguous-eager"


def _torch_mm() -> str:
    from opgate.matrix import installed_torch
    from opgate.matrix.cell import torch_major_minor

    return torch_major_minor(installed_torch())


@pytest.fixture(scope="module")
def segv_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    out = tmp_path_factory.mktemp("segv")
    return out, opgate_run(out, "--select", "fx_segv.*-cpu-*")


def test_segfault_is_error_naming_the_signal_and_neighbours_pass(segv_run: tuple[Path, Any]) -> None:
    out, proc = segv_run
    assert proc.returncode == CellsFailed.exit_code, proc.stderr
    v = verdicts(out)
    assert v[cell_id("fx_segv", "bf16")] == "pass"
    assert v[cell_id("fx_segv", "fp32")] == "pass"
    bad = next(c for c in RunResults.read(out / "results.json").cells if c.id == cell_id("fx_segv", "fp16"))
    assert bad.verdict is Verdict.ERROR
    assert bad.reason.startswith("worker killed by SIGSEGV")
    assert bad.attempts == 2  # re-run once in a fresh worker, crashed again
    log = (out / "logs" / f"{bad.id}.log").read_text()
    assert "Segmentation fault" in log  # faulthandler's dump, written into the cell's own log
    assert "fx_segv/impl.py" in log
    assert "=== worker killed by SIGSEGV" in log


def test_a_library_that_calls_exit_is_an_error_quoting_what_it_printed(tmp_path: Path) -> None:
    """bitsandbytes' C code prints its reason and calls exit(1): the reason must carry that line."""
    proc = opgate_run(
        tmp_path, "--ops-path", str(ROOT / "tests" / "fixtures_exit"), "--select", "fx_exit.*-cpu-*"
    )
    assert proc.returncode == CellsFailed.exit_code, proc.stderr
    cells = {c.id: c for c in RunResults.read(tmp_path / "results.json").cells}
    assert cells[cell_id("fx_exit", "fp32")].verdict is Verdict.PASS
    bad = cells[cell_id("fx_exit", "fp16")]
    assert bad.verdict is Verdict.ERROR
    assert bad.reason.startswith(
        "worker exited with code 1; last output: Error invalid argument at line 74 in file /src/csrc/ops.cu"
    ), bad.reason


def test_dead_worker_is_replaced_and_reused_workers_serve_several_cells(segv_run: tuple[Path, Any]) -> None:
    out, _ = segv_run
    workers = run_record(out)["workers"]
    first = workers[0]
    assert first["cells"] == [cell_id("fx_segv", "bf16"), cell_id("fx_segv", "fp16")]
    assert first["end"] == "worker killed by SIGSEGV"
    after = [w for w in workers if cell_id("fx_segv", "fp32") in w["cells"]]
    assert len(after) == 1
    assert after[0]["pid"] != first["pid"]
    assert all(w["kind"] == "cpu" for w in workers)


def test_requires_skip_and_every_cell_has_its_files(segv_run: tuple[Path, Any]) -> None:
    out, proc = segv_run
    run = RunResults.read(out / "results.json")
    skips = [c for c in run.cells if c.cell.impl == "needs_dist"]
    assert len(skips) == 3
    assert {c.reason for c in skips} == {"requires opgate-fixture-not-installed (not installed here)"}
    recorded = {p.stem for p in (out / "cells").glob("*.json")}
    skipped = out / "cells" / "skipped.jsonl"  # plan-time skips: one record per line, one file
    if skipped.exists():
        recorded |= {json.loads(line)["id"] for line in skipped.read_text().splitlines() if line.strip()}
    assert recorded == {c.id for c in run.cells}
    for c in run.cells:
        assert c.env["env_key"] == run.env["env_key"]
        if c.verdict.ran:
            assert (out / "logs" / f"{c.id}.log").exists()
            assert f"--seed {c.seed}" in c.repro
            assert c.repro.startswith(f"opgate run --select '{c.id}'")
    assert "error 1" in proc.stdout
    assert "pass 2" in proc.stdout


def test_results_json_round_trips(segv_run: tuple[Path, Any]) -> None:
    out, _ = segv_run
    raw = json.loads((out / "results.json").read_text())
    assert RunResults.read(out / "results.json").to_json() == raw
    single = json.loads((out / "cells" / f"{cell_id('fx_segv', 'fp32')}.json").read_text())
    assert single in raw["cells"]


def test_junit_mirrors_the_results(segv_run: tuple[Path, Any]) -> None:
    out, _ = segv_run
    xml = JUnitXml.fromfile(str(out / "junit.xml"))
    suites = list(xml)
    assert [s.name for s in suites] == ["fx_segv"]
    cases = {c.name: c for c in suites[0]}
    assert len(cases) == 6
    assert all(c.classname == "fx_segv" for c in cases.values())
    crash = cases[cell_id("fx_segv", "fp16")].result[0]
    assert isinstance(crash, Error)
    assert "SIGSEGV" in crash.message
    assert isinstance(cases[cell_id("fx_segv", "fp32", "needs_dist")].result[0], Skipped)
    assert cases[cell_id("fx_segv", "bf16")].is_passed


def test_hang_is_killed_at_its_timeout_and_not_retried(tmp_path: Path) -> None:
    proc = opgate_run(tmp_path, "--select", "fx_hang.native-*-cpu-*")
    assert proc.returncode == CellsFailed.exit_code, proc.stderr
    run = RunResults.read(tmp_path / "results.json")
    by = {c.id: c for c in run.cells}
    hung = by[cell_id("fx_hang", "fp16")]
    assert hung.verdict is Verdict.ERROR
    assert hung.reason == "timeout after 4 s (worker killed)"  # the config's per-cell override
    assert hung.attempts == 1
    assert by[cell_id("fx_hang", "bf16")].verdict is Verdict.PASS
    assert by[cell_id("fx_hang", "fp32")].verdict is Verdict.PASS
    log = (tmp_path / "logs" / f"{hung.id}.log").read_text()
    assert "fx_hang/impl.py" in log  # stack dump taken before the kill shows where it hung
    workers = run_record(tmp_path)["workers"]
    assert workers[0]["end"] == "timeout after 4 s (worker killed)"
    assert cell_id("fx_hang", "fp32") in workers[-1]["cells"]


def test_fail_then_pass_is_flaky(tmp_path: Path) -> None:
    marker = tmp_path / "flaky.marker"
    out = tmp_path / "out"
    proc = opgate_run(out, "--select", "fx_flaky.native-*-cpu-*", env={"OPGATE_FX_FLAKY_MARKER": str(marker)})
    assert proc.returncode == CellsFailed.exit_code, proc.stderr
    by = {c.id: c for c in RunResults.read(out / "results.json").cells}
    first = by[cell_id("fx_flaky", "bf16")]  # wrong in its first worker, right in a fresh one
    assert first.verdict is Verdict.FLAKY
    assert first.attempts == 2
    assert first.reason.startswith("flaky: attempt 1 fail")
    attempt1 = first.check("attempt_1")
    assert attempt1 is not None
    assert attempt1.status is Verdict.FAIL
    assert any(c["status"] == "fail" for c in attempt1.details["checks"])
    assert by[cell_id("fx_flaky", "fp16")].verdict is Verdict.PASS
    assert by[cell_id("fx_flaky", "fp32")].verdict is Verdict.PASS
    workers = run_record(out)["workers"]
    first_pid = marker.read_text()
    retry = [w for w in workers if w["cells"] == [first.id]]
    assert len(retry) == 1
    assert str(retry[0]["pid"]) != first_pid


def _killed_run(out: Path, who: str) -> subprocess.Popen[str]:
    env = {**os.environ, "OPGATE_CACHE": str(out / "cache"), "OPGATE_FX_KILL": who}
    env["OPGATE_FX_KILL_MARKER"] = str(out / "kill.marker")
    out.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "opgate.validators", "run", "--config", str(CONFIG)]
    argv += ["--ops-path", str(FIXTURES), "--select", "fx_killed.native-*-cpu-*", "--out", str(out)]
    argv += ["--no-progress", "--no-cache", "--jobs", "1"]
    pipe = subprocess.PIPE
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=pipe, stderr=pipe, text=True)


def _marker_pid(marker: Path, proc: subprocess.Popen[str], timeout_s: float = 240.0) -> int:
    """The pid the op wrote into the marker once it runs (the run is still going)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        text = marker.read_text() if marker.exists() else ""
        if text.strip():
            return int(text)
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"the op never started: {proc.communicate()[1][-2000:]}")


def _assert_error_not_flaky(out: Path, proc: subprocess.Popen[str], reason: str) -> None:
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == CellsFailed.exit_code, stderr[-2000:]
    (cell,) = RunResults.read(out / "results.json").cells
    assert cell.verdict is Verdict.ERROR, cell.reason
    assert cell.reason.startswith(reason), cell.reason
    assert cell.reason.endswith("(re-run in a fresh worker: pass)")
    assert cell.attempts == 2
    attempt1 = cell.check("attempt_1")
    assert attempt1 is not None
    assert attempt1.status is Verdict.ERROR
    assert any(c.name == "correctness" and c.status is Verdict.PASS for c in cell.checks)


def test_a_worker_killed_from_outside_is_an_error_naming_the_signal(tmp_path: Path) -> None:
    """A real SIGKILL sent to a real worker while its op runs (what the OOM killer does)."""
    proc = _killed_run(tmp_path, "worker")
    os.kill(_marker_pid(tmp_path / "kill.marker", proc), signal.SIGKILL)
    _assert_error_not_flaky(tmp_path, proc, "worker killed by SIGKILL from outside the cell")
    log = (tmp_path / "logs" / f"{cell_id('fx_killed', 'bf16')}.log").read_text()
    assert "=== worker killed by SIGKILL from outside the cell" in log


def test_a_worker_lost_with_its_fork_server_is_an_error(tmp_path: Path) -> None:
    """The op kills the fork server it was forked from; the kernel takes the worker down with it."""
    proc = _killed_run(tmp_path, "forkserver")
    _assert_error_not_flaky(tmp_path, proc, "worker vanished (no exit status: its fork server is gone)")
