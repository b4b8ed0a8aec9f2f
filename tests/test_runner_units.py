"""Runner logic without workers: placement, torch filter, timeouts, repro, retries, flaky merging."""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import signal
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest

from opgate.matrix.cell import Cell
from opgate.validators import device
from opgate.validators.attempts import AttemptView, merge_attempts, wants_retry
from opgate.validators.device import Gpu, plan_cells
from opgate.validators.limits import timeout_for
from opgate.validators.options import RunOptions, repro_command
from opgate.validators.pool import Attempt, Pool, Task
from opgate.validators.progress import Progress
from opgate.validators.result import CellResult, CheckResult, Verdict
from opgate.validators.worker import jsonable
from opgate.validators.workerproc import WorkerConfig, exit_description, killed_from_outside

H200 = Gpu(0, "NVIDIA H200", "9.0")
A100 = Gpu(1, "NVIDIA A100-SXM4-80GB", "8.0")


def cell(
    arch: str = "cpu",
    mode: str = "eager",
    torch: str = "2.13.0+cpu",
    overrides: tuple[tuple[str, Any], ...] = (),
    **kw: str,
) -> Cell:
    cuda = "none" if arch == "cpu" else "13.0"
    return Cell(
        op=kw.get("op", "rms_norm"),
        impl=kw.get("impl", "triton"),
        torch=torch,
        cuda=kw.get("cuda", cuda),
        arch=arch,
        dtype=kw.get("dtype", "all" if mode == "build" else "fp32"),
        layout=kw.get("layout", "all" if mode == "build" else "contiguous"),
        mode=mode,
        overrides=overrides,
    )


# -- placement ---------------------------------------------------------------------------------
def test_cpu_cells_run_on_cpu_workers() -> None:
    p = device.place(cell(), gpus=[])
    assert (p.kind, p.skip_reason, p.isolate) == ("cpu", "", False)


def test_gpu_cell_without_that_arch_skips_with_reason() -> None:
    assert device.place(cell("sm_90"), gpus=[]).skip_reason == "no sm_90 device here"
    assert device.place(cell("sm_80"), gpus=[H200]).skip_reason == "no sm_80 device here"


def test_gpu_cell_goes_to_a_gpu_of_its_arch() -> None:
    p = device.place(cell("sm_90"), gpus=[A100, H200])
    assert (p.kind, p.arch) == ("cuda", "sm_90")


def test_aoti_and_marked_cells_are_isolated_cudagraphs_cells_share_workers() -> None:
    assert not device.place(cell("sm_90", "cudagraphs"), gpus=[H200]).isolate
    assert device.place(cell("sm_90", "aoti"), gpus=[H200]).isolate
    assert device.place(cell("sm_90", "cudagraphs", overrides=(("isolate", True),)), gpus=[H200]).isolate
    assert device.place(cell(overrides=(("isolate", True),)), gpus=[]).isolate
    assert not device.place(cell("sm_90", "compile"), gpus=[H200]).isolate


def test_build_cells_need_their_nvcc() -> None:
    build = cell("sm_90", "build", cuda="12.9")
    assert "validators.toolchain missing" in device.place(build, [], nvcc_finder=None).skip_reason
    assert device.place(build, [], nvcc_finder=lambda v: None).skip_reason == "nvcc 12.9 not found here"

    def broken(version: str) -> str:
        raise RuntimeError("wheel has no nvcc driver")

    assert "wheel has no nvcc driver" in device.place(build, [], nvcc_finder=broken).skip_reason
    found = device.place(build, [], nvcc_finder=lambda v: "/usr/local/bin/nvcc")
    assert (found.kind, found.isolate) == ("build", False)  # its compilers run in child processes


def test_missing_required_distribution_skips() -> None:
    p = device.place(cell(), [], requires=["pyyaml", "opgate-no-such-dist"])
    assert p.kind is None
    assert p.skip_reason == "requires opgate-no-such-dist (not installed here)"


def test_cells_of_another_torch_are_left_out_not_skipped() -> None:
    class Spec:
        implementations: ClassVar[dict[str, object]] = {}

    cells = [cell(torch="2.13.0+cpu"), cell(torch="2.14.1"), cell("sm_90", torch="2.14.1")]
    plan = plan_cells(cells, {"rms_norm": Spec()}, "2.13.0", gpus=[], nvcc_finder=None)
    assert [c.torch for c in plan.cells] == ["2.13.0+cpu"]
    assert plan.other_torch == 2
    assert plan_cells(cells, {}, None, [], None).cells == []  # no torch installed: nothing is ours


def test_each_nvcc_is_looked_up_once_and_a_cpu_only_torch_skips_cuda_builds_at_plan_time() -> None:
    """Build cells of a CUDA C++ op cannot exist beside a CPU-only torch: a skip no worker is started for."""

    class Impl:
        def __init__(self, kind: str) -> None:
            self.kind = kind
            self.requires: list[str] = []

    class Spec:
        implementations: ClassVar[dict[str, object]] = {"cuda": Impl("cuda"), "triton": Impl("triton")}

    asked: list[str] = []

    def finder(version: str) -> str:
        asked.append(version)
        return f"/opt/cuda-{version}/bin/nvcc"

    cells = [
        cell("sm_90", "build", impl=impl, cuda=cuda)
        for impl in ("cuda", "triton")
        for cuda in ("13.0", "13.2")
        for _ in range(3)
    ]
    cells = [dataclasses.replace(c, shapes=f"s{i}") for i, c in enumerate(cells)]
    plan = plan_cells(cells, {"rms_norm": Spec()}, "2.13.0+cpu", [], finder, torch_cuda=None)
    assert sorted(asked) == ["13.0", "13.2"]  # once per version, not once per cell
    kinds = {(c.impl, plan.placements[c.id].kind) for c in cells}
    assert kinds == {("cuda", None), ("triton", "build")}
    reason = next(plan.placements[c.id].skip_reason for c in cells if c.impl == "cuda")
    assert reason == "torch 2.13.0+cpu is CPU-only: no CUDA extension can be built for it"
    gpu_torch = plan_cells(cells, {"rms_norm": Spec()}, "2.13.0+cpu", [], finder, torch_cuda="13.0")
    assert {gpu_torch.placements[c.id].kind for c in cells} == {"build"}
    assert device.installed_torch_cuda() in (None, "") or "." in str(device.installed_torch_cuda())


# -- timeouts, seeds, repro --------------------------------------------------------------------
def test_timeout_precedence() -> None:
    assert timeout_for(cell(mode="eager"), None) == 120.0
    assert timeout_for(cell("sm_90", "compile"), None) == 300.0
    slow = cell(overrides=(("timeout_s", 900.0),))
    assert timeout_for(slow, None) == 900.0
    assert timeout_for(slow, 5.0) == 5.0  # the command line wins for this run


def test_repro_reruns_exactly_one_cell_with_its_seed(tmp_path: Path) -> None:
    opts = RunOptions(out=tmp_path, config=Path("cfg.yaml"), ops_paths=[Path("myops")])
    cmd = repro_command("rms_norm.triton-pt2.13-cpu-fp32-contiguous-eager", 1234, opts)
    assert cmd.startswith(
        "opgate run --select 'rms_norm.triton-pt2.13-cpu-fp32-contiguous-eager' --seed 1234"
    )
    assert f"--config {Path('cfg.yaml').resolve()}" in cmd
    assert f"--ops-path {Path('myops').resolve()}" in cmd
    assert cmd.endswith("--out /tmp/opgate-repro")
    assert "--seed" not in repro_command("x", None, RunOptions(out=tmp_path))


# -- attempts ----------------------------------------------------------------------------------
def view(verdict: Verdict, summary: str = "", timed_out: bool = False) -> AttemptView:
    checks = [CheckResult("correctness", verdict, summary)] if summary else []
    return AttemptView(
        verdict, checks, ["k"], "" if summary else verdict.value, 1.5, timed_out, not timed_out
    )


def test_attempt_verdict_comes_from_checks_when_worker_gives_none() -> None:
    checks = [
        CheckResult("a", Verdict.PASS).to_json(),
        CheckResult("b", Verdict.FALLBACK, "aten ran").to_json(),
    ]
    v = AttemptView.of(Attempt({"checks": checks, "kernels": [], "reason": "", "verdict": None}, 2.0))
    assert v.verdict is Verdict.FALLBACK
    assert v.summary() == "b: aten ran"
    empty = AttemptView.of(Attempt({"checks": [], "kernels": [], "reason": "", "verdict": None}, 0.0))
    assert (empty.verdict, empty.reason) == (Verdict.ERROR, "no check ran")
    garbled = AttemptView.of(Attempt({"checks": [{"name": "x", "status": "maybe"}], "verdict": None}, 0.0))
    assert garbled.verdict is Verdict.ERROR
    assert garbled.reason.startswith("malformed outcome from the worker: ValueError")


def test_failures_and_crashes_are_retried_but_not_timeouts() -> None:
    assert wants_retry(view(Verdict.FAIL, "bad"), 1, retries=1)
    assert wants_retry(view(Verdict.ERROR), 1, retries=1)
    assert not wants_retry(view(Verdict.FAIL, "bad"), 2, retries=1)
    assert not wants_retry(view(Verdict.FAIL, "bad"), 1, retries=0)
    assert not wants_retry(view(Verdict.ERROR, timed_out=True), 1, retries=1)
    assert not wants_retry(view(Verdict.FALLBACK, "aten"), 1, retries=1)


def test_fail_then_pass_is_flaky_with_both_attempts_recorded() -> None:
    verdict, checks, _, reason = merge_attempts([view(Verdict.FAIL, "max err 1.0"), view(Verdict.PASS, "ok")])
    assert verdict is Verdict.FLAKY
    assert [(c.name, c.status) for c in checks] == [
        ("correctness", Verdict.PASS),
        ("attempt_1", Verdict.FAIL),
    ]
    assert checks[1].details["checks"][0]["summary"] == "max err 1.0"
    assert reason == "flaky: attempt 1 fail (correctness: max err 1.0); attempt 2 pass"


def test_fail_twice_stays_fail() -> None:
    verdict, checks, _, reason = merge_attempts([view(Verdict.FAIL, "e1"), view(Verdict.FAIL, "e2")])
    assert verdict is Verdict.FAIL
    assert [c.name for c in checks] == ["correctness", "attempt_2"]
    assert reason == "correctness: e1 (same on re-run)"
    verdict, _, _, reason = merge_attempts([view(Verdict.ERROR), view(Verdict.FAIL, "e2")])
    assert (verdict, reason) == (Verdict.ERROR, "error (re-run: fail)")


def test_exit_descriptions_name_the_signal() -> None:
    assert exit_description(-11) == "worker killed by SIGSEGV"
    assert exit_description(-6) == "worker killed by SIGABRT"
    assert exit_description(3) == "worker exited with code 3"
    assert exit_description(-9) == "worker killed by SIGKILL from outside the cell"
    assert exit_description(None).startswith("worker vanished")


def test_only_signals_from_outside_count_as_external() -> None:
    assert killed_from_outside(-9)  # SIGKILL: the OOM killer, an operator, the parent's death
    assert killed_from_outside(-15)
    assert killed_from_outside(None)  # no exit status: the fork server that could report it died
    assert not killed_from_outside(-11)  # SIGSEGV, SIGABRT, SIGBUS: the op's own crash
    assert not killed_from_outside(-6)
    assert not killed_from_outside(-7)
    assert not killed_from_outside(1)


def test_killed_from_outside_then_pass_is_an_error_not_flaky() -> None:
    killed = AttemptView(
        Verdict.ERROR, [], [], "worker killed by SIGKILL from outside the cell", 1.0, external=True
    )
    verdict, checks, _, reason = merge_attempts([killed, view(Verdict.PASS, "ok")])
    assert verdict is Verdict.ERROR
    assert reason == "worker killed by SIGKILL from outside the cell (re-run in a fresh worker: pass)"
    assert [(c.name, c.status) for c in checks] == [
        ("correctness", Verdict.PASS),
        ("attempt_1", Verdict.ERROR),
    ]
    segv = AttemptView(Verdict.ERROR, [], [], "worker killed by SIGSEGV", 1.0)
    assert merge_attempts([segv, view(Verdict.PASS, "ok")])[0] is Verdict.FLAKY  # the op's own crash
    assert merge_attempts([killed, view(Verdict.FAIL, "bad")])[0] is Verdict.ERROR


def test_details_become_strict_json() -> None:
    assert jsonable({"err": math.nan, "inf": [math.inf], "n": 3, "t": (1.5, None)}) == {
        "err": "nan",
        "inf": ["inf"],
        "n": 3,
        "t": [1.5, None],
    }


# -- pool without torch ------------------------------------------------------------------------
@pytest.mark.integration
def test_worker_that_cannot_start_errors_its_cells_instead_of_looping(tmp_path: Path) -> None:
    config = WorkerConfig(logs=tmp_path / "logs", python="/bin/false")
    pool = Pool(config, host_lanes=1)
    tasks = [
        Task(cell(dtype=d), "cpu", "cpu", 1, 30.0, tmp_path / f"{d}.log", tmp_path / d)
        for d in ("fp32", "bf16")
    ]
    tasks.append(Task(cell("sm_90"), "cuda", "sm_90", 1, 30.0, tmp_path / "g.log", tmp_path / "g"))
    seen: dict[str, str] = {}

    def record(task: Task, answer: Any) -> tuple[()]:
        seen[task.cell.id] = answer.outcome["reason"]
        return ()

    pool.run(tasks, record)
    assert len(pool.workers) == 2  # gave up after two start-up failures
    assert all(w.record(pool.t0)["end"] == "worker exited with code 1" for w in pool.workers)
    reasons = list(seen.values())
    assert sum("cpu worker failed to start: worker exited with code 1" in r for r in reasons) == 2
    assert "no lane runs cuda cells" in seen[cell("sm_90").id]
    assert all(w.proc.returncode is not None for w in pool.workers)


def test_progress_bar_only_on_a_terminal() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    result = CellResult(cell(), Verdict.PASS, env={})
    quiet = io.StringIO()
    Progress(3, enabled=True, stream=quiet).update(result)
    assert quiet.getvalue() == ""
    off = Tty()
    Progress(3, enabled=False, stream=off).update(result)
    assert off.getvalue() == ""
    log = Tty()
    bar = Progress(3, enabled=True, stream=Tty(), log=log)
    bar.update(result)
    assert "1/3" in bar.line()
    assert "pass 1" in bar.line()
    assert log.getvalue() == ""  # a terminal gets the bar, not lines


def test_progress_lines_without_a_terminal() -> None:
    """CI and ``| tee``: one line per finished cell on stdout, with elapsed time and ETA; no bar."""

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    bar, log = Tty(), io.StringIO()
    progress = Progress(4, enabled=True, stream=bar, log=log)
    for verdict in (Verdict.PASS, Verdict.FAIL):
        progress.update(CellResult(cell(), verdict, env={}, duration_s=2.5))
    progress.close()
    lines = log.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[1].startswith("[2/4] fail ")
    assert f"2.5 s  {cell().id}  elapsed 00:00  eta 00:00" in lines[1]
    assert bar.getvalue() == ""  # `| tee` to a terminal: lines only, never a bar among them
    quiet = io.StringIO()
    Progress(4, enabled=False, log=quiet).update(CellResult(cell(), Verdict.PASS, env={}))
    assert quiet.getvalue() == ""  # --no-progress


def test_default_jobs_one_per_core_on_small_machines_half_on_large() -> None:
    cores = os.cpu_count() or 1
    assert device.default_jobs() == (cores if cores <= 4 else cores // 2)
    assert device.threads_per_worker(device.default_jobs()) * device.default_jobs() <= max(cores, 1)


def test_summary_names_each_bad_cell_with_its_reason_and_repro(tmp_path: Path) -> None:
    from opgate.validators.progress import format_summary
    from opgate.validators.result import RunResults

    reason = "correctness: err 0.5 > allowed 0.1"
    bad = CellResult(cell(), Verdict.FAIL, env={}, reason=reason, repro="opgate run X")
    good = CellResult(cell("sm_90"), Verdict.PASS, env={}, repro="opgate run Y")
    text = format_summary(RunResults(cells=[bad, good], env={"env_key": "e"}), 1.0, 0, tmp_path)
    lines = text.splitlines()
    at = lines.index(f"  fail     {bad.id}: correctness: err 0.5 > allowed 0.1")
    assert lines[at + 1] == "           repro: opgate run X"
    assert "opgate run Y" not in text  # a passing cell needs no repro


@pytest.mark.integration
def test_a_previous_runs_cell_files_are_moved_aside_and_deleted_in_the_background(tmp_path: Path) -> None:
    import time

    from opgate.validators.outdir import OLD_OUTPUTS, clear_outputs

    for name in ("cells/a.json", "controls/c.json", "logs/a.log", "logs/workers/w.log", "mine.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("{}")
    (tmp_path / "results.json").write_text("{}")
    clear_outputs(tmp_path)
    for gone in ("cells", "controls", "logs", "results.json"):
        assert not (tmp_path / gone).exists(), gone
    deadline = time.monotonic() + 30
    while list(tmp_path.glob(f"{OLD_OUTPUTS}*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(tmp_path.glob(f"{OLD_OUTPUTS}*")) == []
    assert (tmp_path / "mine.txt").exists()  # not opgate's: left alone


class _Servers:
    """A launcher stand-in: whether the cuda server forks and is ready, and what was forked early."""

    def __init__(self, *, forks: bool = True, ready: bool = True) -> None:
        self._forks, self._ready = forks, ready
        self.early: list[tuple[str, str, Gpu | None]] = []

    def forks(self, kind: str) -> bool:
        return self._forks

    def startable(self, kind: str) -> bool:
        return self._ready

    def prefork(self, kind: str, lanes: list[tuple[str, Gpu | None]]) -> None:
        self.early += [(kind, name, gpu) for name, gpu in lanes]


@pytest.mark.parametrize(
    ("servers", "cuda_cells", "forked"),
    [
        (_Servers(), 2, ["gpu0", "gpu0.1"]),  # no more workers than cells
        (_Servers(), 9, ["gpu0", "gpu0.1", "gpu0.2"]),  # no more than lanes
        (_Servers(ready=False), 9, []),  # the server still imports: the pool waits for it, as before
        (_Servers(forks=False), 9, []),  # fresh interpreters: nothing to fork
        (_Servers(), 0, []),  # nothing runs on the GPU
    ],
)
def test_gpu_lanes_first_workers_start_while_the_run_plans(
    tmp_path: Path, servers: _Servers, cuda_cells: int, forked: list[str]
) -> None:
    from opgate.validators.runner import Runner

    runner = Runner(RunOptions(out=tmp_path / "out", config=None, gpu_workers=3))
    runner._gpus = [H200]
    runner._launcher = servers  # type: ignore[assignment]
    runner._prefork(cuda_cells)
    assert [name for _, name, _ in servers.early] == forked
    assert all(kind == "cuda" and gpu is H200 for kind, _, gpu in servers.early)


@pytest.mark.parametrize(("gpus", "builds"), [([H200], True), ([], False)])
def test_build_cells_build_spec_libraries_only_in_a_run_with_gpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpus: list[Gpu], *, builds: bool
) -> None:
    """A spec's ``libraries`` are for GPU cells: on a CPU machine no worker is told to build them."""
    from opgate.validators import runner as runner_module
    from opgate.validators.cuda_build import LIBRARIES_VARIABLE

    started: list[WorkerConfig] = []

    class Recorded:
        def __init__(self, config: WorkerConfig) -> None:
            started.append(config)

        def prestart(self, kinds: list[str]) -> None:
            pass

    monkeypatch.setattr(runner_module, "Launcher", Recorded)
    runner = runner_module.Runner(RunOptions(out=tmp_path / "out", config=None, gpu_workers=2))
    runner._gpus = gpus
    runner._start_servers({"build", "cuda"} if gpus else {"build", "cpu"})
    (config,) = started
    assert config.env("build", None).get(LIBRARIES_VARIABLE) == ("1" if builds else None)


class _EarlyServers(_Servers):
    """The launcher stand-in, with the kinds its servers were asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.kinds: list[str] = []

    def prestart(self, kinds: list[str]) -> None:
        self.kinds += kinds


@pytest.mark.parametrize(
    ("stored_digest", "verdicts_stored", "use_cache", "starts"),
    [
        ("old", False, True, True),
        ("old", True, True, False),  # a change taken back: its verdicts are stored, nothing may run
        ("old", True, False, True),  # --no-cache: every cell runs
        ("now", False, True, False),  # the variants match its sources
        (None, False, True, False),  # never stored: its first run here
    ],
)
def test_a_gpu_op_changed_since_its_variants_were_stored_starts_before_the_cache_lookup(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    stored_digest: str | None,
    *,
    verdicts_stored: bool,
    use_cache: bool,
    starts: bool,
) -> None:
    """Its precompile and the lanes' first workers start from the plan, in the lanes' order; an op
    whose variants still match (or were never stored) leaves it to the lookup, as before."""
    from opgate.validators import runner as runner_module
    from opgate.validators import tritonvariants
    from opgate.validators.cache import VerdictCache
    from opgate.validators.device import MachineShare, Placement

    class Spec:
        path = tmp_path / "rope.yaml"
        root = None

    rope = [cell("sm_90", mode, op="rope") for mode in ("eager", "compile")]
    build = cell("sm_90", "build", op="rope")
    other = cell("sm_90", "eager", op="rms_norm")
    cache = VerdictCache(tmp_path / "cache", {"gpu": "H200"})
    monkeypatch.setattr(cache, "op_digest", lambda spec: "now")
    monkeypatch.setattr(cache, "has", lambda cell, spec: verdicts_stored)
    store = tritonvariants.Store.beside(cache)
    if stored_digest is not None:
        variant = {"module": "m", "name": "k", "data": "{}", "target": {}, "cells": [rope[1].id]}
        store.folder.mkdir(parents=True)
        doc = {"version": tritonvariants.STORE_VERSION, "op_digest": stored_digest, "variants": [variant]}
        (store.folder / "rope.triton.json").write_text(json.dumps(doc))
    started: list[dict[str, Any]] = []

    def start(work: Path, variants: Any, **kw: Any) -> None:
        started.append({"variants": variants, **kw})

    monkeypatch.setattr(tritonvariants, "start", start)
    options = RunOptions(out=tmp_path / "out", config=None, gpu_workers=3, jobs=2, use_cache=use_cache)
    runner = runner_module.Runner(options)
    servers = _EarlyServers()
    runner._launcher = servers  # type: ignore[assignment]
    runner._gpus, runner._cache, runner._specs = [H200], cache, {"rope": Spec(), "rms_norm": Spec()}
    placements = {c.id: Placement("cuda", arch="sm_90") for c in [*rope, other]}
    runner._plan = MachineShare([*rope, build, other], {**placements, build.id: Placement("build")})
    early = runner._start_early()
    early.join()
    early.release()
    if not starts:
        assert (started, servers.kinds, servers.early) == ([], [], [])
        assert not runner._precompiles.ops  # left to the pool's start, which asks for its own cells
        return
    (precompile,) = started
    assert list(precompile["variants"]) == ["rope.triton"]  # rms_norm's variants were never stored
    assert precompile["order"][0] == rope[1].id  # compile cells before eager ones: longest first
    assert sorted(precompile["order"]) == sorted(c.id for c in rope)
    assert precompile["cores"] == len(os.sched_getaffinity(0)) - 3 - 2  # the cores the lanes leave idle
    assert sorted(servers.kinds) == ["build", "cuda"]  # its build cell runs too: the precompile forks from it
    assert [name for _, name, _ in servers.early] == ["gpu0", "gpu0.1"]  # a worker per cell, at most
    assert runner._precompiles.ops == {"rope.triton"}  # the pool's start does not start it again


def test_early_starts_run_beside_the_caller_and_join_raises_what_one_raised() -> None:
    """A start that failed fails the run at the join, as it would have in the run's own thread."""
    import threading

    from opgate.validators.earlystart import Starts

    gate, done = threading.Event(), []

    def waits() -> None:
        assert gate.wait(30)  # runs while the caller goes on (the lookup)
        done.append("waits")

    def fails() -> None:
        raise OSError("no job file")

    def fails_too() -> None:
        raise ValueError("no server")

    starts = Starts(waits, fails, fails_too)
    gate.set()
    with pytest.raises((OSError, ValueError)) as raised:
        starts.join()
    assert done == ["waits"]  # the join waited for every start before raising
    notes = getattr(raised.value, "__notes__", [])
    assert len(notes) == 1
    assert {str(raised.value), notes[0].rsplit(": ", 1)[-1]} == {"no job file", "no server"}  # neither lost
    starts.release()
    Starts().join()  # nothing to start: nothing to wait for


@pytest.mark.integration
def test_a_process_an_early_start_started_lives_until_the_run_releases_the_start() -> None:
    """A child that asks to die with its parent (as every worker and fork server does) is killed when
    the *thread* that started it ends: the start's thread is kept until the run lets it go."""
    import subprocess
    import sys
    import threading

    from opgate.validators.earlystart import Starts

    code = (
        "import ctypes, signal, time; ctypes.CDLL('libc.so.6').prctl(1, signal.SIGKILL); "
        "print('armed', flush=True); time.sleep(120)"
    )
    procs: list[subprocess.Popen[str]] = []

    def start() -> None:
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "armed"  # its parent-death signal is set

    starts = Starts(start)
    starts.join()
    (proc,) = procs
    try:
        time.sleep(0.5)
        assert proc.poll() is None  # the start's work ended; its thread, and so the child, live on
        starts.release()
        assert proc.wait(timeout=30) == -signal.SIGKILL  # the run's end: the thread ends, the child dies
        assert not [t for t in threading.enumerate() if t.name.startswith("opgate-early")]
    finally:
        proc.kill()
        proc.wait()


class _StoppedLauncher(_EarlyServers):
    def __init__(self) -> None:
        super().__init__()
        self.stopped = 0

    def stop(self) -> None:
        self.stopped += 1


@pytest.mark.parametrize("raised", [KeyboardInterrupt, RuntimeError])
def test_a_run_that_raises_in_its_lookup_stops_what_the_early_start_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, raised: type[BaseException]
) -> None:
    """Ctrl-C (or an error) during the lookup: the precompile and the servers the early starts asked
    for are stopped, the start threads end, and what was raised is what the caller sees."""
    import threading

    from opgate.validators import runner as runner_module
    from opgate.validators import tritonvariants
    from opgate.validators.cache import VerdictCache
    from opgate.validators.device import MachineShare, Placement

    class Spec:
        path = tmp_path / "rope.yaml"
        root = None

    rope = [cell("sm_90", mode, op="rope") for mode in ("eager", "compile")]
    cache = VerdictCache(tmp_path / "cache", {"gpu": "H200"})
    monkeypatch.setattr(cache, "op_digest", lambda spec: "now")
    asked: list[str] = []

    def has(c: Cell, spec: Any) -> bool:
        asked.append(c.id)
        if len(asked) > 1:  # the early plan asks for one cell; the lookup's first question raises
            raise raised("interrupted in the lookup")
        return False

    monkeypatch.setattr(cache, "has", has)
    store = tritonvariants.Store.beside(cache)
    store.folder.mkdir(parents=True)
    variant = {"module": "m", "name": "k", "data": "{}", "target": {}, "op_digest": "old"}
    doc = {"version": tritonvariants.STORE_VERSION, "op_digest": "old", "variants": [variant]}
    (store.folder / "rope.triton.json").write_text(json.dumps(doc))
    stops: list[str] = []

    class Started:
        def stop(self) -> dict[str, Any]:
            stops.append("precompile")
            return {"compiled": 0}

    monkeypatch.setattr(tritonvariants, "start", lambda *a, **kw: Started())
    runner = runner_module.Runner(RunOptions(out=tmp_path / "out", config=None, gpu_workers=2, jobs=1))
    launcher = _StoppedLauncher()

    def prepare() -> None:
        runner._launcher = launcher  # type: ignore[assignment]
        runner._gpus, runner._cache, runner._specs = [H200], cache, {"rope": Spec()}
        placements = {c.id: Placement("cuda", arch="sm_90") for c in rope}
        runner._plan = MachineShare(rope, placements)

    monkeypatch.setattr(runner, "_prepare", prepare)
    with pytest.raises(raised, match="interrupted in the lookup"):
        runner._execute()
    assert stops == ["precompile"]
    assert launcher.stopped == 1
    assert launcher.kinds == ["cuda"]  # the early start did ask for the cuda server
    assert not [t for t in threading.enumerate() if t.name.startswith("opgate-early")]
