"""The worker pool's scheduling and failure handling, with a torch-free stand-in worker.

``tests/fixtures_runner/fake_worker.py`` speaks the worker protocol and picks
its behaviour from the cell's layout, so these tests cover what a GPU host
needs (one worker per GPU, CUDA_VISIBLE_DEVICES per worker, sticky device
errors) on a CPU-only machine, in about a second.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from opgate.matrix.cell import Cell
from opgate.validators.device import Gpu
from opgate.validators.lanes import Lane
from opgate.validators.pool import Attempt, Pool, Task
from opgate.validators.workerproc import Launcher, WorkerConfig, visible_device

FAKE = "tests.fixtures_runner.fake_worker"


def task(tmp: Path, arch: str = "cpu", layout: str = "contiguous", dtype: str = "fp32", **kw: Any) -> Task:
    cuda = "none" if arch == "cpu" else "13.0"
    cell = Cell(
        "op", "impl", "2.13.0", cuda, arch, dtype, layout, "eager", shapes=kw.pop("shapes", "default")
    )
    kind = "cpu" if arch == "cpu" else "cuda"
    return Task(cell, kind, arch, 1, kw.pop("timeout_s", 30.0), tmp / f"{cell.id}.log", tmp / cell.id, **kw)


def run_pool(
    tmp: Path, tasks: list[Task], gpus: Sequence[Gpu] = (), lanes: int = 1
) -> tuple[Pool, dict[str, Any]]:
    pool = Pool(WorkerConfig(logs=tmp / "workers", module=FAKE, threads=3), host_lanes=lanes, gpus=gpus)
    done: dict[str, Any] = {}

    def on_done(t: Task, a: Attempt) -> list[Task]:
        done[t.cell.id] = a
        return []

    pool.run(tasks, on_done)
    return pool, done


def probe(attempt: Attempt) -> dict[str, Any]:
    details: dict[str, Any] = attempt.outcome["checks"][0]["details"]
    return details


@pytest.mark.integration
def test_one_worker_per_gpu_each_seeing_only_its_gpu(tmp_path: Path) -> None:
    gpus = [Gpu(0, "NVIDIA H200", "9.0"), Gpu(1, "NVIDIA H200", "9.0"), Gpu(2, "NVIDIA A100", "8.0")]
    sm90 = [task(tmp_path, "sm_90", shapes=f"s{i}") for i in range(8)]
    sm80 = [task(tmp_path, "sm_80", shapes=f"s{i}") for i in range(2)]
    cpu = [task(tmp_path, "cpu", shapes=f"s{i}") for i in range(2)]
    pool, done = run_pool(tmp_path, [*sm90, *sm80, *cpu], gpus)
    seen90 = {probe(done[t.cell.id])["CUDA_VISIBLE_DEVICES"] for t in sm90}
    assert seen90 == {"0", "1"}  # spread over both sm_90 GPUs
    assert {probe(done[t.cell.id])["CUDA_VISIBLE_DEVICES"] for t in sm80} == {"2"}
    for t in [*sm90, *sm80]:
        assert probe(done[t.cell.id])["TRITON_INTERPRET"] is None
    for t in cpu:
        assert probe(done[t.cell.id])["CUDA_VISIBLE_DEVICES"] == ""
        assert probe(done[t.cell.id])["TRITON_INTERPRET"] == "1"
        assert probe(done[t.cell.id])["OMP_NUM_THREADS"] == "3"
    kinds = sorted(w.kind for w in pool.workers)
    assert kinds == ["cpu", "cuda", "cuda", "cuda"]  # reused: one worker per lane
    assert all(w.proc.returncode is not None for w in pool.workers)


def test_a_host_lane_takes_its_own_cells_first_then_borrows_its_gpu() -> None:
    h200 = Gpu(0, "NVIDIA H200", "9.0")
    cuda, build = task(Path("/t"), "sm_90"), task(Path("/t"), shapes="b")
    build.kind = "build"
    lending = Lane("cpu0", gpu=h200, host=True)
    assert lending.pick([cuda, build]) is build  # builds first, though later in the order
    assert lending.pick([cuda]) is cuda
    assert Lane("cpu0", host=True).pick([cuda]) is None  # no GPU lent: host cells only
    assert Lane("gpu0", gpu=h200).pick([build]) is None  # a GPU lane that does not lend: never host cells
    lends = Lane("gpu0", gpu=h200, lends=True)
    importing = {"cuda": False, "build": True}
    assert lends.pick([cuda, build], lambda t: importing[t.kind]) is build  # its own cannot start yet
    assert lends.pick([build, cuda], lambda t: True) is cuda  # its own first once they can
    assert lends.pick([build]) is None  # planning its next worker: its own cells only


@pytest.mark.integration
@pytest.mark.parametrize("gpu_workers", [1, 2])
def test_host_lanes_join_the_gpu_only_where_it_is_shared(tmp_path: Path, gpu_workers: int) -> None:
    """After its host cells, a host lane runs cuda cells (seeing the GPU), unless the GPU has one worker."""
    gpus = [Gpu(0, "NVIDIA H200", "9.0")]
    cuda = [task(tmp_path, "sm_90", shapes=f"s{i}") for i in range(8)]
    cpu = [task(tmp_path, "cpu", shapes="c")]
    config = WorkerConfig(logs=tmp_path / "workers", module=FAKE, threads=3)
    pool = Pool(config, host_lanes=1, gpus=gpus, gpu_workers=gpu_workers)
    done: dict[str, Attempt] = {}

    def on_done(t: Task, a: Attempt) -> list[Task]:
        done[t.cell.id] = a
        return []

    pool.run([*cuda, *cpu], on_done)
    assert done[cpu[0].cell.id].worker.startswith("cpu-cpu0-")
    assert probe(done[cpu[0].cell.id])["CUDA_VISIBLE_DEVICES"] == ""
    on_host = [t for t in cuda if done[t.cell.id].worker.startswith("cuda-cpu0-")]
    if gpu_workers == 1:
        assert not on_host
    else:
        assert on_host  # the host lane's first lane-order turn after its own cell
        for t in on_host:
            assert probe(done[t.cell.id])["CUDA_VISIBLE_DEVICES"] == "0"
            assert probe(done[t.cell.id])["TRITON_INTERPRET"] is None
    assert all(done[t.cell.id].outcome["checks"][0]["status"] == "pass" for t in cuda)


class ImportingServer(Launcher):
    """Fresh interpreters, but one kind's server is 'still importing' until ``ready_at``."""

    def __init__(self, config: WorkerConfig, ready_at: float, kind: str = "cpu") -> None:
        super().__init__(config)
        self.ready_at, self.kind = ready_at, kind

    def startable(self, kind: str) -> bool:
        return kind != self.kind or time.monotonic() >= self.ready_at

    def importing(self) -> bool:
        return time.monotonic() < self.ready_at


@pytest.mark.integration
def test_a_lane_takes_a_cell_whose_server_is_ready_while_another_imports(tmp_path: Path) -> None:
    """The cpu cell comes first in the order, but its server imports for 1.5 s: the build cell goes first."""
    cpu, build = task(tmp_path, shapes="c"), task(tmp_path, shapes="b")
    build.kind = "build"
    config = WorkerConfig(logs=tmp_path / "workers", module=FAKE, threads=3)
    t0 = time.monotonic()
    pool = Pool(config, host_lanes=1, launcher=ImportingServer(config, ready_at=t0 + 1.5))
    done: dict[str, float] = {}

    def on_done(t: Task, a: Attempt) -> list[Task]:
        assert a.outcome["checks"][0]["status"] == "pass", a.outcome  # never "no lane runs cpu cells"
        done[t.cell.id] = time.monotonic() - t0
        return []

    pool.run([cpu, build], on_done)
    assert done[build.cell.id] < 1.5  # it ran while the cpu server imported
    assert done[cpu.cell.id] >= 1.5  # and the cpu cell once that server was ready
    assert [w.kind for w in pool.workers] == ["build", "cpu"]


@pytest.mark.integration
@pytest.mark.parametrize("gpu_workers", [1, 2])
def test_gpu_lanes_take_builds_while_the_cuda_server_imports(tmp_path: Path, gpu_workers: int) -> None:
    """Three builds, one host lane, and the cuda server imports for 1.5 s: GPU lanes that lend build too."""
    builds = [task(tmp_path, shapes=f"b{i}") for i in range(3)]
    for build in builds:
        build.kind = "build"
    cuda = [task(tmp_path, "sm_90", shapes=f"s{i}") for i in range(2)]
    config = WorkerConfig(logs=tmp_path / "workers", module=FAKE, threads=3)
    t0 = time.monotonic()
    launcher = ImportingServer(config, ready_at=t0 + 1.5, kind="cuda")
    pool = Pool(config, 1, [Gpu(0, "NVIDIA H200", "9.0")], gpu_workers=gpu_workers, launcher=launcher)
    done: dict[str, tuple[float, str]] = {}

    def on_done(t: Task, a: Attempt) -> list[Task]:
        assert a.outcome["checks"][0]["status"] == "pass", a.outcome
        done[t.cell.id] = (time.monotonic() - t0, a.worker)
        return []

    pool.run([*cuda, *builds], on_done)
    assert all(done[t.cell.id][0] >= 1.5 for t in cuda)  # cuda cells wait for their server
    on_gpu_lanes = [t for t in builds if done[t.cell.id][1].startswith("build-gpu0")]
    if gpu_workers == 1:
        assert not on_gpu_lanes  # a GPU with one worker keeps its lane
    else:
        assert len(on_gpu_lanes) == 2  # one on each GPU lane, beside the host lane's
        assert all(done[t.cell.id][0] < 1.5 for t in builds)  # all of them while the server imported


def test_visible_device_maps_through_the_parents_list() -> None:
    assert visible_device(1, parent="") == "1"
    assert visible_device(1, parent="4,5") == "5"
    assert visible_device(0, parent="GPU-aaaa,GPU-bbbb") == "GPU-aaaa"


@pytest.mark.integration
def test_abort_costs_one_cell_and_the_lane_gets_a_new_worker(tmp_path: Path) -> None:
    tasks = [task(tmp_path, layout=lay) for lay in ("contiguous", "transposed", "misaligned")]
    pool, done = run_pool(tmp_path, tasks)
    reasons = [done[t.cell.id].outcome["reason"] for t in tasks]
    assert reasons[1] == "worker killed by SIGABRT"
    assert done[tasks[0].cell.id].outcome["checks"][0]["status"] == "pass"
    assert done[tasks[2].cell.id].outcome["checks"][0]["status"] == "pass"
    assert probe(done[tasks[0].cell.id])["pid"] != probe(done[tasks[2].cell.id])["pid"]
    assert "=== worker killed by SIGABRT" in tasks[1].log.read_text()
    assert pool.workers[0].record(pool.t0)["end"] == "worker killed by SIGABRT"


@pytest.mark.integration
def test_sticky_device_error_retires_the_worker(tmp_path: Path) -> None:
    gpus = [Gpu(0, "NVIDIA H200", "9.0")]
    tasks = [task(tmp_path, "sm_90", layout=lay) for lay in ("offset", "contiguous")]
    pool, done = run_pool(tmp_path, tasks, gpus)
    bad = done[tasks[0].cell.id].outcome
    assert bad["reason"].startswith("sticky CUDA error after this cell")
    assert len(pool.workers) == 2
    assert pool.workers[0].record(pool.t0)["end"] == "unhealthy after cell"
    assert pool.workers[1].cells == [tasks[1].cell.id]


def test_lanes_past_their_deadline_together_share_one_grace_period_and_are_killed_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two lanes hung on one cause (a wedged GPU): one stack-dump grace period, both groups killed
    before either is waited for, not a grace and a kill-and-wait each while results go unread."""
    from opgate.validators import pool as pool_module

    events: list[str] = []

    class Hung:
        ready, released, fd = True, False, -1

        def __init__(self, name: str) -> None:
            self.name, self.end = name, ""

        def dump_stacks(self) -> None:
            events.append(f"dump {self.name}")

        def kill_group(self) -> None:
            events.append(f"kill {self.name}")

        def wait(self) -> int:
            events.append(f"wait {self.name}")
            return -9

        def release(self) -> None:
            self.released = True

    monkeypatch.setattr(time, "sleep", lambda s: events.append(f"sleep {s}"))  # the pool's, too
    pool = Pool(WorkerConfig(logs=tmp_path / "workers", module=FAKE), host_lanes=2)
    finished: list[str] = []

    def on_done(t: Task, a: Attempt) -> list[Task]:
        finished.append(a.outcome["reason"])
        return []

    pool._on_done = on_done
    for lane, name in zip(pool.lanes, ("a", "b"), strict=True):
        lane.task = task(tmp_path, shapes=name, timeout_s=1.0)
        lane.current = Hung(name)  # type: ignore[assignment]
        lane.sent_at, lane.deadline = time.monotonic() - 2.0, time.monotonic() - 1.0
    pool._check_deadlines()
    assert events == [
        "dump a", "dump b", f"sleep {pool_module.STACK_DUMP_GRACE_S}", "kill a", "kill b", "wait a", "wait b",
    ]  # fmt: skip
    assert finished == ["timeout after 1 s (worker killed)"] * 2


@pytest.mark.integration
def test_hang_is_killed_after_its_timeout(tmp_path: Path) -> None:
    tasks = [task(tmp_path, layout="strided", timeout_s=1.0), task(tmp_path)]
    pool, done = run_pool(tmp_path, tasks)
    hung = done[tasks[0].cell.id]
    assert hung.timed_out
    assert hung.outcome["reason"] == "timeout after 1 s (worker killed)"
    assert 1.0 <= hung.duration_s < 5.0
    assert "fake_worker.py" in pool.workers[0].log.read_text()  # its stack, dumped before the kill
    assert done[tasks[1].cell.id].outcome["checks"][0]["status"] == "pass"


@pytest.mark.integration
def test_a_dead_workers_pipes_are_closed_when_it_dies_not_at_the_runs_end(tmp_path: Path) -> None:
    """Isolated cells start a worker each: their pipes held to the run's end would take two file
    descriptors per cell, and a large matrix would run out of them (EMFILE) midway."""

    tasks = [task(tmp_path, shapes=f"s{i}", fresh=True) for i in range(12)]
    pool = Pool(WorkerConfig(logs=tmp_path / "workers", module=FAKE), host_lanes=1)
    open_fds: list[int] = []

    def on_done(t: Task, a: Attempt) -> list[Task]:
        open_fds.append(len(list(Path("/proc/self/fd").iterdir())))
        return []

    pool.run(tasks, on_done)
    assert len(open_fds) == 12
    assert max(open_fds[4:]) <= open_fds[3]  # flat: a dead worker's pipes went with it
    gone = [w for w in pool.workers if w.released]
    assert len(gone) == len(pool.workers)


@pytest.mark.integration
def test_a_killed_worker_takes_what_it_started_in_sessions_of_its_own(tmp_path: Path) -> None:
    """A build cell's compilers run under a fork that leads its own session: a timeout's kill of the
    worker's group must take them too, not leave them compiling after the cell is over."""
    import os
    import sys

    from opgate.validators.workerproc import WorkerProcess

    pid_file = tmp_path / "compiler.pid"
    code = (
        "import subprocess, sys, time; "
        "p = subprocess.Popen(['sleep', '600'], start_new_session=True); "
        f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(600)"
    )
    worker = WorkerProcess("w", "build", [sys.executable, "-c", code], dict(os.environ), tmp_path / "w.log")
    deadline = time.monotonic() + 30
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    compiler = int(pid_file.read_text())
    try:
        worker.kill()
        while Path(f"/proc/{compiler}").exists() and "Z" not in _state(compiler):
            assert time.monotonic() < deadline, "the compiler outlived its worker"
            time.sleep(0.05)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(compiler, 9)
    worker.release()


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"


@pytest.mark.integration
def test_a_reaped_workers_pid_is_never_signalled_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its group is killed once, when it is reaped (what it left running); after that its pid, and
    the group named after it, may be another process's (another run's worker leads its own)."""
    import os
    import sys

    from opgate.validators.workerproc import WorkerProcess

    worker = WorkerProcess("w", "cpu", [sys.executable, "-c", "pass"], dict(os.environ), tmp_path / "w.log")
    assert worker.wait(timeout=30) == 0
    signalled: list[tuple[str, int]] = []
    monkeypatch.setattr(os, "killpg", lambda pid, sig: signalled.append(("group", pid)))
    monkeypatch.setattr(os, "kill", lambda pid, sig: signalled.append(("pid", pid)))
    worker.kill_group()
    assert worker.kill() == 0
    assert worker.wait(timeout=1) == 0
    worker.dump_stacks()
    assert signalled == []


@pytest.mark.integration
def test_isolated_cells_each_get_a_fresh_prestarted_worker(tmp_path: Path) -> None:
    tasks = [task(tmp_path, shapes=f"s{i}", fresh=True) for i in range(4)]
    pool = Pool(WorkerConfig(logs=tmp_path / "workers", module=FAKE), host_lanes=1)
    finished: list[tuple[str, float, int]] = []

    def on_done(t: Task, a: Attempt) -> list[Task]:
        finished.append((t.cell.id, time.monotonic(), probe(a)["pid"]))
        return []

    pool.run(tasks, on_done)
    assert [f[0] for f in finished] == [t.cell.id for t in tasks]
    assert len({f[2] for f in finished}) == 4  # a fresh process per cell
    by_pid = {w.pid: w for w in pool.workers}
    for (_, previous_done, previous_pid), (_, _, pid) in itertools.pairwise(finished):
        assert by_pid[pid].started < previous_done  # started while the previous cell still ran
        # ...but not beside the lane's starting worker: CUDA contexts made together slow each other
        assert by_pid[pid].started >= by_pid[previous_pid].ready_at


@pytest.mark.integration
def test_kept_spare_is_warm_before_a_failure_asks_for_a_rerun(tmp_path: Path) -> None:
    pool = Pool(WorkerConfig(logs=tmp_path / "workers", module=FAKE), host_lanes=1, keep_spare=True)
    seen: list[tuple[int, float, int]] = []

    def on_done(t: Task, a: Attempt) -> list[Task]:
        seen.append((t.attempt, time.monotonic(), probe(a)["pid"]))
        return [dataclasses.replace(t, attempt=2, fresh=True)] if t.attempt == 1 else []

    pool.run([task(tmp_path, layout="misaligned", dtype="fp16")], on_done)
    (_, first_done, first_pid), (attempt, _, rerun_pid) = seen
    assert attempt == 2
    assert rerun_pid != first_pid  # a fresh process for the re-run...
    rerun_worker = next(w for w in pool.workers if w.pid == rerun_pid)
    assert rerun_worker.started < first_done  # ...started before the failure came back


def test_the_run_fingerprint_is_a_gpu_workers_when_one_said_hello(tmp_path: Path) -> None:
    """Build workers see no GPU; the run's environment (env_key, GPU name) must come from a GPU worker."""

    class Hello:
        def __init__(self, kind: str, fp: dict[str, Any]) -> None:
            self.kind, self.fingerprint = kind, fp

        def hello(self, msg: dict[str, Any]) -> None:
            self.fingerprint = msg["fingerprint"]

    pool = Pool(WorkerConfig(logs=tmp_path), host_lanes=1)
    build = {"env_key": "pt2.11-cpu", "gpus": []}
    gpu = {"env_key": "pt2.11-H200-sm_90", "gpus": [{"name": "NVIDIA H200"}]}
    pool._on_message(Hello("build", {}), {"type": "hello", "fingerprint": build})  # type: ignore[arg-type]
    assert pool.fingerprint == build
    pool._on_message(Hello("cuda", {}), {"type": "hello", "fingerprint": gpu})  # type: ignore[arg-type]
    pool._on_message(Hello("build", {}), {"type": "hello", "fingerprint": build})  # type: ignore[arg-type]
    assert pool.fingerprint == gpu


class ReadyBetweenLooks(Launcher):
    """The cpu server gets ready after the first look at it: between the pool's two looks."""

    def __init__(self, config: WorkerConfig) -> None:
        super().__init__(config)
        self.looks = 0

    def _ready(self) -> bool:
        self.looks += 1
        return self.looks > 1

    def startable(self, kind: str) -> bool:
        return self._ready()

    def importing(self) -> bool:
        return not self._ready()


@pytest.mark.integration
def test_a_server_ready_between_two_looks_runs_its_cells(tmp_path: Path) -> None:
    """A cell is never an error because its server got ready between the pool's two looks at it."""
    config = WorkerConfig(logs=tmp_path / "workers", module=FAKE, threads=3)
    pool = Pool(config, host_lanes=1, launcher=ReadyBetweenLooks(config))
    outcomes: list[dict[str, Any]] = []

    def on_done(t: Task, a: Attempt) -> list[Task]:
        outcomes.append(a.outcome)
        return []

    pool.run([task(tmp_path, shapes="c")], on_done)
    assert [o["checks"][0]["status"] for o in outcomes] == ["pass"], outcomes


@pytest.mark.integration
def test_workers_started_before_the_pool_are_adopted_by_their_lanes(tmp_path: Path) -> None:
    """The runner forks the GPU lanes' first workers while it plans: the pool runs the cells on them."""
    config = WorkerConfig(logs=tmp_path / "workers", module=FAKE, threads=3)
    h200 = Gpu(0, "NVIDIA H200", "9.0")
    launcher = Launcher(config)
    launcher.prefork("cuda", [("gpu0", h200), ("gpu0.1", h200)])
    early = dict(launcher.preforked)
    pool = Pool(config, 1, [h200], gpu_workers=3, launcher=launcher)
    assert not launcher.preforked  # every one handed to its lane
    done: dict[str, str] = {}

    def on_done(t: Task, a: Attempt) -> list[Task]:
        assert a.outcome["checks"][0]["status"] == "pass", a.outcome
        done[t.cell.id] = a.worker
        return []

    pool.run([task(tmp_path, "sm_90", shapes=f"s{i}") for i in range(6)], on_done)
    assert {"cuda-gpu0-0", "cuda-gpu0.1-0"} <= set(done.values())  # the early workers ran cells
    assert [w for w in pool.workers if w.name.endswith("-0")] == list(early.values())
    assert all(w.proc.returncode is not None for w in pool.workers)


@pytest.mark.integration
def test_an_early_worker_no_lane_takes_is_stopped_with_the_servers(tmp_path: Path) -> None:
    config = WorkerConfig(logs=tmp_path / "workers", module=FAKE, threads=3)
    launcher = Launcher(config)
    launcher.prefork("cuda", [("gpu3", Gpu(3, "NVIDIA H200", "9.0"))])
    (worker,) = launcher.preforked.values()
    launcher.stop()  # the run needed no pool after all
    assert not launcher.preforked
    assert worker.proc.returncode is not None  # reaped, not left behind
    assert worker.end == "started early, not needed"
