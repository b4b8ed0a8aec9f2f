"""Warm fork servers (``opgate run --keep-warm``): reused, refreshed when stale, never a run's leftover.

Real servers (torch imported), real forks, real ``opgate run`` processes.  The
folder is a short private one per test (socket paths are limited to 108
bytes), so no test meets another's server, nor a developer's.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from opgate.validators import warmserver
from opgate.validators.result import RunResults, Verdict
from opgate.validators.workerproc import Launcher, WorkerConfig
from tests.workers import wait_hello

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "fixtures_runner"


@pytest.fixture
def server_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="ogw-", dir="/tmp"))  # short: a socket path
    folder.chmod(0o700)
    monkeypatch.setenv("OPGATE_SERVER_DIR", str(folder))
    try:
        yield folder
    finally:
        warmserver.stop_all()
        _wait_for(lambda: not warmserver.servers(), 20)
        shutil.rmtree(folder, ignore_errors=True)


def _wait_for(cond: Any, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return bool(cond())


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:  # reaped by its server since the signal check
        return True
    return stat.split(")")[-1].split()[0] == "Z"  # dead, not yet reaped by its server


def _launcher(logs: Path) -> Launcher:
    launcher = Launcher(WorkerConfig(logs=logs, fork_server=True, keep_warm_s=120.0))
    launcher.prestart(["cpu"])
    return launcher


def test_a_warm_server_serves_the_next_run_and_kills_what_a_gone_run_left(
    tmp_path: Path, server_dir: Path
) -> None:
    first = _launcher(tmp_path / "1")
    worker = first.spawn("cpu-a-1", "cpu", None)
    assert first.servers["cpu"].warm
    wait_hello(worker)
    assert not first.servers["cpu"].reused
    assert first.servers["cpu"].preload_s > 0.5  # this run paid for the imports
    worker.close()
    assert worker.wait(timeout=10) == 0
    first.stop()
    assert first.warm == {"cpu": "started"}
    (info,) = warmserver.servers()  # still up after its run
    assert info["kind"] == "cpu"
    assert Path(info["path"]).parent == server_dir

    second = _launcher(tmp_path / "2")
    assert second.servers["cpu"].wait_ready(5)  # no import to wait for
    assert second.servers["cpu"].reused
    assert second.servers["cpu"].preload_s == 0.0
    left = second.spawn("cpu-b-1", "cpu", None)
    hello = wait_hello(left)
    assert float(hello["startup_s"]) < 1.0
    assert hello["fingerprint"]["torch"]
    assert os.getpgid(left.pid) == left.pid  # its own group, as any worker's
    os.kill(left.pid, signal.SIGSEGV)  # a crash is still reported as what it was
    assert left.wait(timeout=10) == -signal.SIGSEGV
    orphan = second.spawn("cpu-b-2", "cpu", None)
    wait_hello(orphan)
    second.stop()  # the run goes away with a worker still up: the server must kill it
    assert second.warm == {"cpu": "reused"}
    assert _wait_for(lambda: _gone(orphan.pid), 10), "a gone run's worker outlived it"
    assert [i["pid"] for i in warmserver.servers()] == [info["pid"]]  # the same server, still warm

    assert [i["pid"] for i in warmserver.stop_all()] == [info["pid"]]
    assert _wait_for(lambda: not warmserver.servers(), 20)
    assert not list(server_dir.glob("*.sock"))  # it tidied up after itself


def _children(pid: int) -> set[int]:
    """The live (not zombie) children of ``pid``."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        found |= {int(c) for c in (task / "children").read_text().split()}
    return {c for c in found if not _gone(c)}


def test_standby_workers_wait_between_runs_for_the_next_runs_lanes(
    tmp_path: Path, server_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that leaves gets its lanes' workers ready for the next; isolated cells never get one."""
    monkeypatch.setenv("OPGATE_STANDBY", "all")  # CPU workers too: GPU workers only by default
    first = _launcher(tmp_path / "1")
    workers = [first.spawn(f"cpu-a-{n}", "cpu", None) for n in (1, 2)]
    for worker in workers:
        assert "standby" not in wait_hello(worker)  # a new server has none yet
    first.stop()
    (info,) = warmserver.servers()
    server = int(info["pid"])
    ran = {w.pid for w in workers}
    assert _wait_for(lambda: len(_children(server) - ran) == 2, 30), (
        "no standby for each of the run's workers"
    )
    assert _wait_for(lambda: not ran & _children(server), 10), "a gone run's worker outlived it"
    standbys = _children(server)
    time.sleep(0.5)  # their hello to the server (a CPU worker has nothing to warm up)

    second = _launcher(tmp_path / "2")
    taken = second.spawn("cpu-b-1", "cpu", None)
    hello = wait_hello(taken)
    assert taken.pid in standbys
    assert hello["standby"]["waited_s"] >= 0.5
    assert float(hello["startup_s"]) < 1.0  # counted from when this run took it
    assert os.getpgid(taken.pid) == taken.pid  # its own group, as any worker's
    assert Path(f"/proc/{taken.pid}/cwd").resolve() == Path.cwd().resolve()
    fresh = second.spawn("cpu-b-2", "cpu", None, fresh=True)  # an isolated cell: a new fork
    assert "standby" not in wait_hello(fresh)
    assert fresh.pid not in standbys
    other = second.spawn("cpu-b-3", "cpu", None)
    assert "standby" in wait_hello(other)
    assert {taken.pid, other.pid} == standbys
    last = second.spawn("cpu-b-4", "cpu", None)  # none left: a fork
    assert "standby" not in wait_hello(last)
    os.kill(taken.pid, signal.SIGSEGV)  # a crash is still reported as what it was
    assert taken.wait(timeout=10) == -signal.SIGSEGV
    taken.hello(hello)  # as the pool takes it
    assert taken.record(0.0)["standby"] == hello["standby"]  # run.json: this one was warm before the run
    second.stop()  # three of its workers were up at once: three standbys for the next run
    assert _wait_for(lambda: _gone(other.pid) and _gone(last.pid) and _gone(fresh.pid), 10)
    assert _wait_for(lambda: len(_children(server)) == 3, 30)
    refilled = _children(server)

    third = _launcher(tmp_path / "3")  # a worker of another GPU: those standbys do not fit it
    server_of_third = third.servers["cpu"]
    env = {**third.config.env("cpu", None), "CUDA_VISIBLE_DEVICES": "7"}
    log = tmp_path / "3" / "other-gpu.log"
    other_gpu = server_of_third.fork(env, log, "cpu", standby=True)
    assert other_gpu.pid not in refilled  # a fork
    assert refilled <= _children(server)  # untouched
    third.stop()  # it asked for one worker of that GPU's environment, none of the others
    assert _wait_for(lambda: not refilled & _children(server), 10), "standbys of an environment not asked for"
    assert _wait_for(lambda: len(_children(server)) == 1, 30), "no standby for the other GPU's worker"
    (kept,) = _children(server)
    assert kept not in refilled

    monkeypatch.setenv("OPGATE_STANDBY", "0")  # keyed: a server of its own
    off = _launcher(tmp_path / "4")
    worker = off.spawn("cpu-d-1", "cpu", None)
    assert "standby" not in wait_hello(worker)
    off.stop()
    (info_off,) = [i for i in warmserver.servers() if i["pid"] != server]
    time.sleep(1.0)
    assert not _children(int(info_off["pid"]))  # none forked for a run that turned them off

    warmserver.stop_all()
    assert _wait_for(lambda: _gone(kept), 10), "a standby outlived its server"


def test_a_stale_warm_server_is_replaced_and_the_key_follows_import_time_settings(
    tmp_path: Path, server_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module the server imported changes: the next run gets a fresh server, not stale code."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import warm_probe_module\n")
    probe = site / "warm_probe_module.py"
    probe.write_text("VERSION = 1\n")
    monkeypatch.setenv("PYTHONPATH", f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    first = _launcher(tmp_path / "1")
    assert first.servers["cpu"].wait_ready(120)
    first.stop()
    (old,) = warmserver.servers()

    probe.write_text("VERSION = 2  # edited after the server imported it\n")
    os.utime(probe, ns=(time.time_ns(), time.time_ns() + 10**9))
    second = _launcher(tmp_path / "2")
    assert second.servers["cpu"].wait_ready(120)
    assert not second.servers["cpu"].reused  # it paid for fresh imports
    worker = second.spawn("cpu-b-1", "cpu", None)
    wait_hello(worker)
    worker.close()
    worker.wait(timeout=10)
    second.stop()
    assert "was stale" in (tmp_path / "2" / "forkserver-cpu.log").read_text()
    assert str(probe) in (server_dir / Path(old["path"]).with_suffix(".log").name).read_text()
    assert _wait_for(lambda: [i["pid"] for i in warmserver.servers()] != [old["pid"]], 10)
    assert _wait_for(lambda: _gone(int(old["pid"])), 10)  # the stale one left once unused

    argv = ["/usr/bin/python3", "-m", "opgate.validators.worker", "--kind", "cpu"]
    base = {"PATH": "/usr/bin", "TORCHINDUCTOR_COMPILE_THREADS": "1"}
    same = warmserver.key(argv, base)
    assert warmserver.key(argv, {**base, "GITHUB_RUN_ID": "7"}) == same  # per-job noise: same server
    assert warmserver.key(argv, {**base, "TORCHINDUCTOR_COMPILE_THREADS": "4"}) != same  # read at import
    assert warmserver.key(argv, {**base, "TRITON_INTERPRET": "1"}) != same
    assert warmserver.key([*argv, "--threads", "2"], base) != same
    with_ops = warmserver.server_argv([*argv, "--ops-path", "/x/ops"])
    assert with_ops == argv  # specs are the run's, loaded per run: not part of the server


def test_a_folder_open_to_others_is_never_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    monkeypatch.setenv("OPGATE_SERVER_DIR", str(shared))
    assert warmserver.server_dir() is None
    log = tmp_path / "log"
    assert warmserver.connect(["python"], {}, log, kind="cpu", idle_s=1, ops_paths=()) is None
    assert "no private folder" in log.read_text()


def _opgate_run(ops: Path, out: Path, *extra: str) -> tuple[dict[str, Any], RunResults]:
    sel = ["--select", "fx_segv.native-*-cpu-*", "--select", "fx_flaky.native-*-cpu-fp32-*"]
    base = [sys.executable, "-m", "opgate.validators", "run", "--config", str(ops / "matrix.yaml")]
    proc = subprocess.run(
        [*base, "--ops-path", str(ops), *sel, "--out", str(out), "--no-progress", "--no-cache", *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    return json.loads((out / "run.json").read_text()), RunResults.read(out / "results.json")


@pytest.mark.slow
def test_runs_on_a_warm_server_judge_as_runs_on_their_own(
    tmp_path: Path, server_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same verdicts, a crash still costs only its cell, and a spec edited between runs is seen.

    The second and third runs' workers include standbys the earlier run left (``OPGATE_STANDBY``).
    """
    ops = tmp_path / "ops"
    shutil.copytree(FIXTURES, ops, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setenv("OPGATE_STANDBY", "all")  # the later runs' lanes take standby workers
    own_record, own = _opgate_run(ops, tmp_path / "own")
    first_record, first = _opgate_run(ops, tmp_path / "first", "--keep-warm", "5")
    second_record, second = _opgate_run(ops, tmp_path / "second", "--keep-warm", "5")
    assert own_record["warm_servers"] == {}
    assert first_record["warm_servers"] == {"cpu": "started"}
    assert second_record["warm_servers"] == {"cpu": "reused"}
    assert second_record["fork_server_preload_s"] == {"cpu": 0.0}
    verdicts = {c.id: c.verdict for c in own.cells}
    assert {c.id: c.verdict for c in first.cells} == verdicts
    assert {c.id: c.verdict for c in second.cells} == verdicts
    crashed = [i for i, v in verdicts.items() if "fp16" in i and i.startswith("fx_segv")]
    assert crashed
    assert all(verdicts[i] is Verdict.ERROR for i in crashed)  # SIGSEGV: its own cell only
    assert sum(v is Verdict.PASS for v in verdicts.values()) == len(verdicts) - len(crashed)
    crash_reason = {c.id: c.reason for c in second.cells}[crashed[0]]
    assert "SIGSEGV" in crash_reason
    assert not any("standby" in w for w in first_record["workers"])
    assert any("standby" in w for w in second_record["workers"])

    spec = ops / "fx_flaky" / "spec.yaml"  # the worker must judge with the edited spec
    wrong = spec.read_text().replace("reference: fx_common:scale", "reference: fx_common:sample_inputs")
    spec.write_text(wrong)
    third_record, third = _opgate_run(ops, tmp_path / "third", "--keep-warm", "5")
    assert third_record["warm_servers"] == {"cpu": "reused"}
    flaky = next(c for c in third.cells if c.id.startswith("fx_flaky"))
    assert flaky.verdict is Verdict.ERROR, flaky.reason
    assert "sample_inputs() missing" in flaky.reason  # the edited reference ran, in a reused server
    ran = [w for w in third_record["workers"] if flaky.id in w["cells"]]  # its lane's, then its re-run's
    assert "standby" in ran[0]  # a standby, forked before the edit, loaded the specs when the run took it


def test_a_runs_end_leaves_its_warm_forks_to_the_server(tmp_path: Path, server_dir: Path) -> None:
    """The pool does not wait for a warm server's forks to exit: the server kills and reaps them."""
    from opgate.validators.pool import Pool

    launcher = _launcher(tmp_path / "1")
    pool = Pool(launcher.config, host_lanes=1, launcher=launcher)
    worker = pool._spawn("cpu", pool.lanes[0])
    wait_hello(worker)
    pool.shutdown()
    assert worker.proc.returncode is None  # not waited for: its exit is the server's business
    assert worker.end == "run finished"
    assert _wait_for(lambda: _gone(worker.pid), 10), "a finished run's worker outlived it"
    (info,) = warmserver.servers()  # the server itself stays warm
    assert info["kind"] == "cpu"
