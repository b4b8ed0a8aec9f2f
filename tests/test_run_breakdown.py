"""Where a run's time went: categories from check durations, the harness share from wall x lanes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from opgate.matrix.cell import Cell
from opgate.validators.__main__ import main
from opgate.validators.breakdown import breakdown, category, format_breakdown
from opgate.validators.schedule import longest_first


def _cell(cid: str, checks: dict[str, float], duration: float) -> dict[str, object]:
    return {
        "id": cid,
        "duration_s": duration,
        "checks": [{"name": n, "status": "pass", "duration_s": s} for n, s in checks.items()],
    }


CELLS = [
    _cell("a", {"compile": 4.0, "correctness": 1.0, "evidence": 0.5}, 6.0),
    _cell("b", {"build": 8.0}, 8.5),
    _cell("c", {"cudagraphs": 2.0, "correctness": 0.5, "attempt_1": 1.0}, 4.0),
    _cell("cached", {"compile": 100.0}, 100.0),
    {"id": "skipped", "duration_s": 0.0, "checks": []},
]
RUN = {
    "timings": {"wall_s": 10.0},
    "cached_cells": ["cached"],
    "workers": [
        {"name": "cuda-gpu0-1", "startup_s": 2.0, "cells": ["a", "c"]},
        {"name": "build-cpu0-2", "startup_s": 1.5, "cells": ["b"]},
        {"name": "cuda-gpu0-3", "startup_s": 2.0, "cells": []},  # a spare never used
    ],
}


def test_harness_splits_into_set_up_and_idle_lanes_before_and_after_their_first_worker() -> None:
    """Idle lane time is what no cell occupied: the wait for the first worker, then the rest."""
    workers: list[dict[str, Any]] = [
        {"name": "cuda-gpu0-1", "startup_s": 2.0, "ready_s": 3.0, "cells": ["a", "c"]},
        {"name": "build-cpu0-2", "startup_s": 1.5, "ready_s": 1.0, "cells": ["b"]},
        {"name": "cuda-gpu0-3", "startup_s": 2.0, "ready_s": 0.5, "cells": []},  # a spare never used
    ]
    run = {**RUN, "workers": workers}
    parts = breakdown(CELLS, run)["harness_parts_s"]
    # capacity 20, cells 18.5 of lane time (set-up 1.5 of it): 1.5 idle, 1.0 + 3.0 before first workers
    assert parts["cell set-up outside checks"] == 1.5
    assert parts["lanes idle before their first worker was ready"] == 1.5  # capped at the idle time
    assert parts["lanes idle after it"] == 0.0
    quick = {**RUN, "workers": [{**w, "ready_s": 0.25} for w in workers]}
    parts = breakdown(CELLS, quick)["harness_parts_s"]
    before, after = parts["lanes idle before their first worker was ready"], parts["lanes idle after it"]
    assert (before, after) == (0.5, 1.0)
    assert breakdown(CELLS, RUN)["harness_parts_s"]["lanes idle before their first worker was ready"] == 0.0


def test_the_runs_own_end_is_said_apart_from_the_lanes_tail() -> None:
    """After the pool every lane is idle while the run writes results.json, junit.xml and history."""
    workers: list[dict[str, Any]] = [
        {"name": "cuda-gpu0-1", "startup_s": 2.0, "ready_s": 0.25, "cells": ["a", "c"]},
        {"name": "build-cpu0-2", "startup_s": 1.5, "ready_s": 0.25, "cells": ["b"]},
    ]
    # 2 lanes, wall 10: the pool ran from 0.5 s to 9.5 s, the run wrote its results for 0.5 s
    run = {**RUN, "workers": workers, "timings": {"wall_s": 10.0, "plan_s": 0.5, "pool_s": 9.0}}
    parts = breakdown(CELLS, run)["harness_parts_s"]
    assert parts["lanes idle while the run writes its results"] == 1.0  # 0.5 s x 2 lanes
    assert parts["lanes idle after it"] == 0.0  # of the 1.0 idle after the first workers
    assert parts["lanes idle before their first worker was ready"] == 0.5
    assert (
        breakdown(CELLS, {**run, "workers": workers, "timings": {"wall_s": 10.0}})["harness_parts_s"][
            "lanes idle while the run writes its results"
        ]
        == 0.0
    )  # a run.json of an older opgate: no pool timings, nothing said


def test_categories() -> None:
    assert [category(n) for n in ("build", "sass", "cudagraphs", "export", "evidence", "gradcheck")] == [
        "build", "build", "compile", "compile", "profiling", "kernel runs",
    ]  # fmt: skip
    assert category("attempt_2") == "re-runs"
    assert category("opcheck:test_aot_dispatch_dynamic") == "compile"


def test_breakdown_splits_capacity_into_work_and_harness() -> None:
    b = breakdown(CELLS, RUN)
    assert b["lanes"] == ["cpu0", "gpu0"]  # the unused spare's lane counts once, via the used worker
    assert b["capacity_s"] == 20.0
    assert b["work_s"] == {
        "build": 8.0, "compile": 6.0, "kernel runs": 1.5, "profiling": 0.5, "re-runs": 1.0, "controls": 0.0,
    }  # fmt: skip
    assert b["harness_s"] == 3.0  # 20 - 17
    assert b["harness_share"] == 0.15
    assert (b["cells_ran"], b["cells_cached"]) == (3, 1)  # the cached cell's 100 s are not this run's
    assert b["harness_parts_s"]["cell set-up outside checks"] == 1.5
    text = format_breakdown(b)
    assert "harness" in text
    assert "15.0%" in text


def test_cell_time_is_split_by_op_largest_first() -> None:
    """What a change to one op can cost at best: its cells' time on the lanes, set-up included."""
    cells = [
        {**_cell("rope.triton-pt2.13-cpu-fp32-contiguous-eager", {"correctness": 1.0}, 2.0)},
        {**_cell("x", {"compile": 4.0}, 5.0), "axes": {"op": "rms_norm"}},
        {**_cell("y", {"compile": 1.0}, 1.5), "axes": {"op": "rope"}},
        _cell("cached", {"compile": 100.0}, 100.0),
    ]
    b = breakdown(cells, RUN)
    assert b["by_op_s"] == {"rms_norm": 5.0, "rope": 3.5}
    assert list(b["by_op_s"]) == ["rms_norm", "rope"]
    assert "cell time by op: rms_norm 5.0 s (59%), rope 3.5 s (41%)" in format_breakdown(b)


def test_controls_are_work_not_harness() -> None:
    """A control holds a lane as long as a cell does: its seconds are the run's work, not the harness's."""
    check = {"name": "cudagraphs", "status": "pass", "duration_s": 2.0}
    controls = [
        {"id": "ctl", "duration_s": 2.5, "checks": [check]},
        {"id": "ctl-cached", "duration_s": 50.0, "checks": []},  # served from the verdict cache
    ]
    run = {**RUN, "cached_cells": ["cached", "ctl-cached"]}
    b = breakdown(CELLS, run, controls)
    assert b["work_s"]["controls"] == 2.5
    assert b["controls_ran"] == 1
    assert b["harness_s"] == 0.5  # 20 - 17 - 2.5
    assert b["work_s"]["compile"] == 6.0  # a control's checks are not counted twice


def test_cli_prints_a_finished_run_and_refuses_a_bad_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "results.json").write_text(json.dumps({"cells": CELLS}))
    (tmp_path / "run.json").write_text(json.dumps(RUN))
    assert main(["breakdown", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[str(tmp_path)]["harness_s"] == 3.0
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["breakdown", str(empty)]) == 7
    assert "not a finished run folder" in capsys.readouterr().err


def test_expensive_modes_are_scheduled_first() -> None:
    cells = [Cell("op", "triton", "2.13.0", "13.0", "sm_90", "bf16", "contiguous", m) for m in
             ("eager", "export", "cudagraphs", "build", "compile", "eager")]  # fmt: skip
    assert [c.mode for c in longest_first(cells)] == [
        "build",
        "cudagraphs",
        "compile",
        "export",
        "eager",
        "eager",
    ]


def test_ops_take_turns_within_a_cost() -> None:
    """Six lanes must not all start on one CUDA C++ op and wait on its build together."""
    cells = [
        Cell(op, impl, "2.13.0", "13.0", "sm_90", dtype, "contiguous", "eager")
        for op, impl in (("rms_norm", "cuda"), ("silu_mul", "cuda"), ("rope", "triton"))
        for dtype in ("fp32", "fp16", "bf16")
    ]
    order = [(c.op, c.dtype) for c in longest_first(cells)]
    assert order[:3] == [("rms_norm", "fp32"), ("silu_mul", "fp32"), ("rope", "fp32")]
    assert sorted(order) == sorted((c.op, c.dtype) for c in cells)


def test_a_set_up_that_waited_for_nvcc_counts_as_build_not_harness() -> None:
    """The first cells of a CUDA C++ op wait in set-up while nvcc builds its extension."""
    waited = {**_cell("a", {"compile": 4.0, "correctness": 1.0, "evidence": 0.5}, 6.0), "setup_build_s": 0.4}
    b = breakdown([waited, *CELLS[1:]], RUN)
    assert b["work_s"]["build"] == 8.4
    assert b["harness_s"] == 2.6
    assert b["harness_parts_s"]["cell set-up outside checks"] == 1.1


def test_waiting_on_another_lanes_build_or_compile_is_harness_not_work() -> None:
    """A lane blocked on a lock while another lane builds did nothing: its wait is not build work."""
    waited = {
        **_cell("a", {"compile": 4.0, "correctness": 1.0, "evidence": 0.5}, 6.0),
        "setup_build_s": 0.1,
        "setup_wait_s": 0.3,
    }
    waited["checks"][0]["waited_s"] = 1.5  # type: ignore[index] # of the compile check's 4.0 s
    b = breakdown([waited, *CELLS[1:]], RUN)
    plain = breakdown([{**CELLS[0], "setup_build_s": 0.1}, *CELLS[1:]], RUN)
    assert b["work_s"]["build"] == plain["work_s"]["build"] == 8.1  # the set-up's own nvcc only
    assert b["work_s"]["compile"] == plain["work_s"]["compile"] - 1.5
    assert b["harness_s"] == plain["harness_s"] + 1.5
    assert b["harness_parts_s"]["waiting on another lane's build or compile"] == 1.8
    assert b["harness_parts_s"]["cell set-up outside checks"] == 1.1  # 0.5 of a's 6.0 s, 0.5 + 0.1
    assert plain["harness_parts_s"]["waiting on another lane's build or compile"] == 0.0
    parts = b["harness_parts_s"]
    named = sum(
        parts[k] for k in ("cell set-up outside checks", "waiting on another lane's build or compile")
    )
    idle = parts["lanes idle before their first worker was ready"] + parts["lanes idle after it"]
    assert round(named + idle, 2) == b["harness_s"]  # every harness second is in one part
    assert "waiting on another lane's build or compile" in format_breakdown(b)


def test_a_build_lock_wait_is_timed_apart_from_the_build(tmp_path: Path) -> None:
    """cuda_build's lock: blocked time goes to BUILD_WAIT_SECONDS; ``wait=False`` refuses instead.

    ``flock`` locks belong to an open file, so a second open of the lock file in this
    process contends like another worker's.
    """
    import fcntl
    import threading
    import time

    from opgate.validators import cuda_build

    lock_path = tmp_path / ".lock"
    with lock_path.open("w") as other, lock_path.open("w") as lock:
        fcntl.flock(other, fcntl.LOCK_EX)  # another process is building this key
        with pytest.raises(cuda_build.BuildBusy):
            cuda_build._lock(lock, [0.0], wait=False)
        threading.Timer(0.4, fcntl.flock, (other, fcntl.LOCK_UN)).start()  # its build ends
        waited = [0.0]
        t0 = time.monotonic()
        cuda_build._lock(lock, waited, wait=True)
        assert 0.3 <= waited[0] <= time.monotonic() - t0
        fcntl.flock(lock, fcntl.LOCK_UN)
        free = [0.0]
        cuda_build._lock(lock, free, wait=False)  # nobody holds it: taken at once
        assert free == [0.0]


def test_the_set_up_build_time_travels_from_the_worker_to_results_json() -> None:
    from opgate.validators.attempts import AttemptView
    from opgate.validators.checks import CellOutcome
    from opgate.validators.lanes import Attempt
    from opgate.validators.result import CellResult, CheckResult, Verdict
    from opgate.validators.worker import outcome_json

    outcome = CellOutcome(
        [CheckResult("correctness", Verdict.PASS, "ok")], setup_build_s=12.5, setup_wait_s=3.25
    )
    wire = outcome_json(outcome)
    cell = Cell("rms_norm", "cuda", "2.11.0", "13.0", "sm_90", "fp32", "contiguous", "cudagraphs")
    view = AttemptView.of(Attempt(wire, 14.0))
    assert (view.setup_build_s, view.setup_wait_s) == (12.5, 3.25)
    record = CellResult(
        cell,
        Verdict.PASS,
        {},
        duration_s=14.0,
        setup_build_s=view.setup_build_s,
        setup_wait_s=view.setup_wait_s,
    )
    back = CellResult.from_json(json.loads(json.dumps(record.to_json())))
    assert (back.setup_build_s, back.setup_wait_s) == (12.5, 3.25)
    plain = CellResult(cell, Verdict.PASS, {}).to_json()
    assert "setup_build_s" not in plain  # no build in set-up: the record stays as it was
    assert "setup_wait_s" not in plain


def test_triton_variants_compiled_beside_the_lanes_are_said_apart_not_counted() -> None:
    precompile = {
        "ops": {"rope.triton": 39},
        "processes": 8,
        "compiled": 39,
        "failed": 0,
        "unfinished": 0,
        "ready_s": 0.22,
        "last_compiled_s": 3.24,
        "recorded": {"rope.triton": 39},
    }
    b = breakdown(CELLS, {**RUN, "triton_precompile": precompile})
    assert b["capacity_s"] == breakdown(CELLS, RUN)["capacity_s"]  # other cores: not the lanes'
    assert b["harness_s"] == breakdown(CELLS, RUN)["harness_s"]
    assert "recorded" not in b["beside_lanes"]["triton_precompile"]
    assert (
        "beside the lanes: 39 Triton variants compiled ahead (rope.triton 39) by 8 process(es), "
        "imports done 0.22 s in, last 3.24 s in; 0 failed, 0 unfinished"
    ) in format_breakdown(b)
    recorded_only = {**RUN, "triton_precompile": {"recorded": {"rope.triton": 3}}}  # nothing compiled ahead
    assert breakdown(CELLS, recorded_only)["beside_lanes"] == {}
    assert "beside the lanes" not in format_breakdown(breakdown(CELLS, RUN))
