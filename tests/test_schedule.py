"""Cells placed by measured cost over every lane of every visible GPU (N, not 2), with fake devices.

The torch-free stand-in worker (``tests/fixtures_runner/fake_worker.py``)
sleeps as long as a cell's ``shapes`` say (``sleep0.4``), so the pool's
placement is timed for real without a GPU: longest measured cells first,
spread over all GPUs' lanes, idle lanes' workers stopped early, and a shutdown
that does not wait on workers one at a time.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from opgate.matrix.cell import Cell
from opgate.validators.device import Gpu
from opgate.validators.pool import Attempt, Pool, Task
from opgate.validators.schedule import (
    History,
    expected_costs,
    gpu_makespan,
    host_lanes,
    lanes_needed,
    longest_first,
)
from opgate.validators.workerproc import WorkerConfig, visible_device

FAKE = "tests.fixtures_runner.fake_worker"


def cell(mode: str = "eager", arch: str = "sm_90", shapes: str = "default", op: str = "op") -> Cell:
    cuda = "none" if arch == "cpu" else "13.0"
    return Cell(op, "impl", "2.13.0", cuda, arch, "fp32", "contiguous", mode, shapes=shapes)


def test_history_is_per_environment_merged_on_save_and_survives_garbage(tmp_path: Path) -> None:
    env_a: dict[str, Any] = {"gpus": [{"name": "H200"}]}
    env_b: dict[str, Any] = {"gpus": []}
    first = History.load(tmp_path, env_a)
    assert first.durations == {}
    first.update({"x": 1.5, "never-ran": 0.0})
    first.fingerprint = {"torch": "2.13.0"}
    first.save()
    other = History.load(tmp_path, env_a)  # a run that started meanwhile writes its own cells
    other.update({"y": 2.0})
    other.save()
    again = History.load(tmp_path, env_a)
    assert again.durations == {"x": 1.5, "y": 2.0}
    assert again.fingerprint == {"torch": "2.13.0"}
    assert History.load(tmp_path, env_b).durations == {}  # another machine's costs are not ours
    assert again.path is not None
    again.update({"x": 0.5})  # a warm re-run: the last figure drops, the peak stays
    assert (again.durations["x"], again.peaks["x"]) == (0.5, 1.5)
    again.path.write_text("{not json")
    assert History.load(tmp_path, env_a).durations == {}


def test_two_runs_sharing_a_cache_keep_each_others_measurements(tmp_path: Path) -> None:
    """Shards with one cache: each loaded the history at its start; the one saving last must not
    put back the figures it loaded over what the other measured meanwhile."""
    env: dict[str, Any] = {"gpus": []}
    earlier = History.load(tmp_path, env)
    earlier.update({"x": 10.0, "y": 1.0})
    earlier.save()
    shard_a, shard_b = History.load(tmp_path, env), History.load(tmp_path, env)
    shard_a.update({"x": 50.0})  # x changed and got slower
    shard_a.save()
    shard_b.update({"y": 2.0})
    shard_b.save()
    now = History.load(tmp_path, env)
    assert now.durations == {"x": 50.0, "y": 2.0}
    assert now.peaks == {"x": 50.0, "y": 2.0}
    shard_b.update({"x": 20.0})  # a later figure of its own wins; the peak stays the longest seen
    shard_b.save()
    later = History.load(tmp_path, env)
    assert (later.durations["x"], later.peaks["x"]) == (20.0, 50.0)


def test_measured_costs_order_the_cells_and_peers_stand_in_for_the_unmeasured() -> None:
    a, b, c, d = (
        cell("eager", shapes="a"),
        cell("eager", shapes="b"),
        cell("compile"),
        cell("eager", shapes="d"),
    )
    history = {a.id: 9.0, b.id: 0.5, c.id: 2.0}
    costs = expected_costs([a, b, c, d], history)
    assert costs[d.id] == pytest.approx(4.75)  # median of its measured (arch, mode) peers
    assert [x.id for x in longest_first([b, c, a, d], costs)] == [a.id, d.id, c.id, b.id]
    hist = History(None, {a.id: 1.0, b.id: 2.0}, peaks={a.id: 9.0, b.id: 2.0})
    assert expected_costs([a, b], hist)[a.id] == 1.0  # --no-cache: nothing changed, the last run
    assert expected_costs([a, b], hist, changed=[a.id])[a.id] == 9.0  # its op changed: its cold cost
    no_history = longest_first([cell("eager"), cell("build"), cell("compile")])
    assert [x.mode for x in no_history] == ["build", "compile", "eager"]  # the per-mode defaults


def test_lanes_are_opened_only_for_work_that_keeps_them_busy(tmp_path: Path) -> None:
    assert lanes_needed([5.0, 5.0, 5.0], lanes=4) == 3  # no more lanes than cells
    assert lanes_needed([4.0, 3.0, 2.0], lanes=4, makespan_s=20.0) == 1  # fits one lane within the run
    assert lanes_needed([10.0, 10.0, 10.0], lanes=4, makespan_s=20.0) == 2
    assert gpu_makespan([3.0, 1.0, 1.0, 1.0], lanes=3) == 3.0

    def task(mode: str, kind: str, i: int) -> Task:
        return Task(cell(mode, shapes=f"s{i}"), kind, "sm_90", 1, 60.0, tmp_path, tmp_path)

    builds = [task("build", "build", i) for i in range(3)]
    gpu = [task("eager", "cuda", i) for i in range(24)]
    tasks = builds + gpu
    measured = History(None, {t.cell.id: 2.0 for t in tasks})
    costs = expected_costs([t.cell for t in tasks], measured)
    assert host_lanes(tasks, costs, jobs=2, gpu_lanes=6, history=measured) == 1  # 6 s of builds, 8 s of GPU
    assert host_lanes(tasks, costs, jobs=2, gpu_lanes=12, history=measured) == 2  # the GPUs finish in 4 s
    assert host_lanes(tasks, costs, jobs=2, gpu_lanes=6, history=History(None, {})) == 2  # guesses: all
    assert host_lanes(tasks, costs, jobs=2, gpu_lanes=6, history=measured, lend=True) == 2  # none idles
    assert host_lanes(builds, costs, jobs=2, gpu_lanes=0, history=measured) == 2  # a CPU-only machine


def run_pool(tmp: Path, tasks: list[Task], gpus: list[Gpu], lanes: int = 1) -> tuple[Pool, dict[str, Any]]:
    pool = Pool(WorkerConfig(logs=tmp / "workers", module=FAKE), host_lanes=1, gpus=gpus, gpu_workers=lanes)
    done: dict[str, Any] = {}

    def on_done(t: Task, a: Attempt) -> list[Task]:
        done[t.cell.id] = (a, time.monotonic())
        return []

    pool.run(tasks, on_done)
    return pool, done


def gpu_task(tmp: Path, seconds: float, n: int) -> Task:
    c = cell(shapes=f"sleep{seconds}", op=f"op{n}")
    return Task(c, "cuda", "sm_90", 1, 60.0, tmp / f"{c.id}.log", tmp / c.id)


@pytest.mark.integration
def test_cells_spread_over_every_visible_gpu_by_measured_cost(tmp_path: Path) -> None:
    """Four GPUs, two lanes each: the long cells start first on separate lanes, every GPU gets work."""
    gpus = [Gpu(i, "NVIDIA H200", "9.0") for i in range(4)]
    long = [gpu_task(tmp_path, 0.8, i) for i in range(4)]
    short = [gpu_task(tmp_path, 0.1, 10 + i) for i in range(24)]
    costs = {t.cell.id: float(t.cell.shapes[5:]) for t in long + short}
    by_id = {t.cell.id: t for t in long + short}
    order = [by_id[c.id] for c in longest_first([t.cell for t in short + long], costs)]
    assert order[:4] == long
    t0 = time.monotonic()
    pool, done = run_pool(tmp_path, order, gpus, lanes=2)
    wall = time.monotonic() - t0
    seen = {json.dumps(a.outcome["checks"][0]["details"]["CUDA_VISIBLE_DEVICES"]) for a, _ in done.values()}
    assert seen == {'"0"', '"1"', '"2"', '"3"'}
    # ideal makespan: 3.2 + 2.4 s of work on 8 lanes = 0.7 s; LPT gives 0.8 s plus start-up
    assert wall < 0.8 + 2.5
    lanes = {w.name.split("-")[1] for w in pool.workers}
    assert len(lanes - {"cpu0"}) == 8  # all eight GPU lanes served cells...
    assert "cpu0" in lanes  # ...and the host lane, with no host cell to run, joined them


def test_visible_devices_of_a_restricted_parent_map_through(monkeypatch: pytest.MonkeyPatch) -> None:
    """``CUDA_VISIBLE_DEVICES=4,5,6,7``: the parent's GPU i is physical 4+i, for N GPUs."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    cfg = WorkerConfig(logs=Path("/tmp/unused"))
    assert [cfg.env("cuda", Gpu(i, "NVIDIA H200", "9.0"))["CUDA_VISIBLE_DEVICES"] for i in range(4)] == [
        "4", "5", "6", "7",
    ]  # fmt: skip
    assert visible_device(2, parent="GPU-a,GPU-b,GPU-c") == "GPU-c"


@pytest.mark.integration
def test_idle_lanes_stop_their_workers_early_and_shutdown_waits_on_none(tmp_path: Path) -> None:
    gpus = [Gpu(0, "NVIDIA H200", "9.0"), Gpu(1, "NVIDIA H200", "9.0")]
    tasks = [gpu_task(tmp_path, 1.0, 0), gpu_task(tmp_path, 0.05, 1)]
    pool, _ = run_pool(tmp_path, tasks, gpus)
    short_worker = next(w for w in pool.workers if tasks[1].cell.id in w.cells)
    assert short_worker.end == "lane idle: nothing left to run"  # retired while the long cell ran
    assert pool.shutdown_s < 1.0
    assert all(w.proc.returncode is not None for w in pool.workers)


def _spec(impls: dict[str, Any]) -> Any:
    from types import SimpleNamespace

    return SimpleNamespace(implementations=impls)


def test_gpu_cells_start_after_the_builds_of_what_they_load(tmp_path: Path) -> None:
    """A CUDA C++ impl's GPU cells wait for its build cells; a declared library, for every builder of it."""
    from types import SimpleNamespace

    from opgate.matrix.spec import Library
    from opgate.validators.schedule import prerequisites

    replay = Library("replay", (tmp_path / "replay.cpp",))
    specs = {
        "a": _spec({"impl": SimpleNamespace(kind="triton", libraries=(replay,))}),
        "b": _spec({"impl": SimpleNamespace(kind="triton", libraries=(replay,))}),
        "c": _spec({"impl": SimpleNamespace(kind="cuda", libraries=(), sources=())}),
        "d": _spec({"impl": SimpleNamespace(kind="triton", libraries=())}),
    }

    def task(op: str, mode: str, kind: str) -> Task:
        return Task(cell(mode, op=op), kind, "sm_90", 1, 60.0, tmp_path, tmp_path)

    tasks = [task(op, "build", "build") for op in "abcd"] + [task(op, "eager", "cuda") for op in "abcd"]
    after = prerequisites(tasks, specs)
    build = {t.cell.op: t.cell.id for t in tasks if t.kind == "build"}
    gpu = {t.cell.op: t.cell.id for t in tasks if t.kind == "cuda"}
    assert after[gpu["a"]] == after[gpu["b"]] == {build["a"], build["b"]}  # either may build replay
    assert after[gpu["c"]] == {build["c"]}
    assert gpu["d"] not in after  # a plain Triton op loads nothing built
    only_gpu = [t for t in tasks if t.kind == "cuda"]  # builds cached: nothing to wait for
    assert prerequisites(only_gpu, specs) == {}
    # what the build cache holds already is waited for by nobody (a warm run, a one-op change)
    in_cache = prerequisites(tasks, specs, lambda name, *_: name == "replay")
    assert in_cache == {gpu["c"]: frozenset({build["c"]})}


def test_a_library_looks_built_when_the_cache_holds_its_key(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The planner's look, without torch: name, sources, arches and torch must all match."""
    from opgate.validators import cuda_build

    src = tmp_path / "lib" / "launch.cpp"
    src.parent.mkdir()
    src.write_text("int f() { return 1; }\n")
    monkeypatch.setenv("OPGATE_BUILD_CACHE", str(tmp_path / "builds"))
    args = ("launch", [src], ["sm_80", "sm_90"], False)
    assert not cuda_build.looks_built(*args, "2.11.0+cu130")  # an empty cache
    key = {"name": "launch", "torch": "2.11.0+cu130", "nvcc": "13.0", "arch_list": "8.0;9.0"}
    key["sources"] = cuda_build.source_hash([src])
    marker = tmp_path / "builds" / "launch-pt2.11.0-cu13.0-80_90-abc" / cuda_build.MARKER
    marker.parent.mkdir(parents=True)
    marker.write_text(json.dumps({"key": key, "library": "x.so"}))
    assert cuda_build.looks_built(*args, "2.11.0+cu130")
    assert not cuda_build.looks_built(*args, "2.13.0")  # built for another torch
    assert not cuda_build.looks_built("launch", [src], ["sm_90"], False, "2.11.0+cu130")  # other arches
    src.write_text("int f() { return 2; }\n")
    assert not cuda_build.looks_built(*args, "2.11.0+cu130")  # the source changed since
    marker.write_text("{torn")
    assert not cuda_build.looks_built(*args, None)


@pytest.mark.integration
def test_a_lane_runs_other_cells_while_a_build_it_needs_is_under_way(tmp_path: Path) -> None:
    """One GPU lane: the cell waiting for a build goes after a cell that can run now, not before."""
    gpus = [Gpu(0, "NVIDIA H200", "9.0")]

    def build_task(shapes: str, op: str) -> Task:
        c = cell("build", shapes=shapes, op=op)
        return Task(c, "build", "sm_90", 1, 60.0, tmp_path / f"{c.id}.log", tmp_path / c.id)

    build = build_task("sleep0.6", "x")
    needs = gpu_task(tmp_path, 0.05, 1)
    free = gpu_task(tmp_path, 0.05, 2)
    pool = Pool(WorkerConfig(logs=tmp_path / "workers", module=FAKE), host_lanes=1, gpus=gpus, gpu_workers=1)
    done: dict[str, float] = {}

    def on_done(t: Task, a: Attempt) -> list[Task]:
        done[t.cell.id] = time.monotonic()
        return []

    pool.run([needs, free, build], on_done, after={needs.cell.id: frozenset({build.cell.id})})
    assert done[free.cell.id] < done[needs.cell.id]  # the lane ran the free cell first...
    assert done[build.cell.id] < done[needs.cell.id]  # ...and the other only once the build was done
    # a build cell that says its libraries are built lets them start while it goes on
    done.clear()
    early = build_task("built0.8", "y")
    pool = Pool(WorkerConfig(logs=tmp_path / "workers1", module=FAKE), host_lanes=1, gpus=gpus, gpu_workers=1)
    pool.run([needs, early], on_done, after={needs.cell.id: frozenset({early.cell.id})})
    assert done[needs.cell.id] < done[early.cell.id]
    # without the prerequisite the lane keeps the given order
    done.clear()
    pool = Pool(WorkerConfig(logs=tmp_path / "workers2", module=FAKE), host_lanes=1, gpus=gpus, gpu_workers=1)
    pool.run([needs, free, build], on_done)
    assert done[needs.cell.id] < done[free.cell.id]


def test_the_build_cache_is_looked_at_once_per_library(tmp_path: Path) -> None:
    """Planning asks the build cache about each library once, however many cells load it."""
    from types import SimpleNamespace

    from opgate.matrix.spec import Library
    from opgate.validators.schedule import prerequisites

    replay = Library("replay", (tmp_path / "replay.cpp",))
    impl = SimpleNamespace(kind="triton", libraries=(replay,), arch_policy={"sass": ["sm_90"]})
    specs = {"a": _spec({"impl": impl})}
    tasks = [Task(cell("build", op="a"), "build", "sm_90", 1, 60.0, tmp_path, tmp_path)]
    tasks += [
        Task(cell("eager", shapes=f"s{i}", op="a"), "cuda", "sm_90", 1, 60.0, tmp_path, tmp_path)
        for i in range(50)
    ]
    looks: list[str] = []

    def built(name: str, *_: object) -> bool:
        looks.append(name)
        return False

    after = prerequisites(tasks, specs, built)
    assert len(after) == 50
    assert looks == ["replay"]
