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
