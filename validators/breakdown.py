"""Where a run's wall time went: build, compile, kernel runs, profiling, and the harness itself.

A PR gate is used only if it is fast, and it can only be made fast where the
time is known.  The checks time themselves (``CheckResult.duration_s``); the
runner knows its wall time and which lanes (worker slots) served cells.  The
capacity of a run is ``wall x busy lanes``; whatever of it was not spent inside
a check is the harness's: worker start-up not hidden behind other work, a
cell's set-up (inputs, the float64 oracle, resets), scheduling, and lanes idle
while the last cells finish.  That share is the figure to keep small: it is
the part no faster kernel or warmer cache will shrink.

A lane blocked while another lane builds the library or compiles the Triton
kernel its cell needs (both are built once, behind a lock) did no work either:
the checks and set-ups record those waits (``waited_s``, ``setup_wait_s``) and
they count as the harness's, not as build or compile work.  Counted as build
work, one cold H200 run's five GPU lanes waiting 23 s each for the one library a
sixth was building made the harness look 11% of the run.

Each op's cell time (``by_op_s``) bounds what re-validating a change to that
op can cost at best: its cells' lane-seconds spread over the lanes.  An op
with a tenth of the matrix's cell time cannot be re-validated 10x faster than
the whole matrix by any scheduling; only less work per cell gets there.

``opgate breakdown DIR`` prints it for a finished run folder;
the runner also stores it in ``run.json``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from opgate.matrix.modes import MODES

#: Check name -> category, besides each mode's own check (named like the mode,
#: its category in :mod:`opgate.matrix.modes`: a compiling mode's check includes
#: the first, compiling calls).  Build covers nvcc / ptxas and the binary listing.
CATEGORIES: Mapping[str, str] = {
    **{name: m.category for name, m in MODES.items()},
    "triton_build": "build",
    "sass": "build",
    "opcheck:test_aot_dispatch_dynamic": "compile",
    "evidence": "profiling",
}
#: ``controls``: environment controls (:mod:`validators.controls`), the op's reference run through
#: a mode after a cell failed there: work the run did on a lane, not the harness's.
ORDER = ("build", "compile", "kernel runs", "profiling", "re-runs", "controls")


def category(check_name: str) -> str:
    if check_name.startswith("attempt_"):
        return "re-runs"
    return CATEGORIES.get(check_name, "kernel runs")


def _lane(worker_name: str) -> str:
    """``cuda-gpu0-7`` -> ``gpu0`` (worker names: ``validators.workerproc.worker_name``)."""
    parts = worker_name.split("-")
    return parts[1] if len(parts) >= 3 else worker_name


def _op(cell: Mapping[str, Any]) -> str:
    """The cell's op: its ``axes``, else its id's first part (``rope.triton-pt2.13-...`` -> ``rope``)."""
    axes = cell.get("axes")
    if isinstance(axes, Mapping) and axes.get("op"):
        return str(axes["op"])
    return str(cell.get("id") or "?").split(".", 1)[0]


#: What a run's ``triton_precompile`` record (validators/tritonvariants.py) the breakdown shows.
PRECOMPILE_FIELDS = ("ops", "processes", "compiled", "failed", "unfinished", "ready_s", "last_compiled_s")


def breakdown(
    cells: Sequence[Mapping[str, Any]], run: Mapping[str, Any], controls: Sequence[Mapping[str, Any]] = ()
) -> dict[str, Any]:
    """Seconds per category and the harness share, from results.json cells (and controls) and run.json."""
    cached = set(run.get("cached_cells") or [])
    ran = [c for c in cells if c.get("id") not in cached and c.get("checks")]
    per: dict[str, float] = dict.fromkeys(ORDER, 0.0)
    cell_s = accounted = waits = 0.0
    by_op: dict[str, float] = {}
    for cell in ran:
        secs = float(cell.get("duration_s") or 0.0)
        cell_s += secs
        op = _op(cell)
        by_op[op] = by_op.get(op, 0.0) + secs
        per["build"] += float(cell.get("setup_build_s") or 0.0)  # the set-up's own nvcc
        setup_wait = float(cell.get("setup_wait_s") or 0.0)  # blocked on another process's nvcc
        waits += setup_wait
        accounted += float(cell.get("setup_build_s") or 0.0) + setup_wait
        for check in cell.get("checks") or []:
            secs = float(check.get("duration_s") or 0.0)
            waited = min(float(check.get("waited_s") or 0.0), secs)  # on another worker's compile
            per[category(str(check.get("name")))] += secs - waited
            waits += waited
            accounted += secs
    controls_ran = [c for c in controls if c.get("id") not in cached]
    for control in controls_ran:  # a control's own set-up is part of it, as it occupies the lane
        per["controls"] += float(control.get("duration_s") or 0.0)
    workers = run.get("workers") or []
    lanes = sorted({_lane(str(w.get("name"))) for w in workers if w.get("cells")})
    wall = float((run.get("timings") or {}).get("wall_s") or 0.0)
    capacity = wall * len(lanes)
    work = sum(per.values())
    harness = max(capacity - work, 0.0)
    startup = sum(float(w.get("startup_s") or 0.0) for w in workers)
    preload = sum(float(v) for v in (run.get("fork_server_preload_s") or {}).values())
    # what no cell occupied: before each lane's first worker was ready (fork-server imports,
    # planning), and after it (waits on a server, a worker's start-up not hidden, the last cells)
    idle = max(capacity - cell_s - per["controls"], 0.0)
    first_ready: dict[str, float] = {}
    for w in workers:
        if w.get("cells") and w.get("ready_s") is not None:
            lane = _lane(str(w.get("name")))
            first_ready[lane] = min(first_ready.get(lane, wall), float(w["ready_s"]))
    before_first = min(sum(first_ready.values()), idle)
    # every lane idle while the run itself ends after its pool: the precompile stopped, the variants
    # stored, results.json, junit.xml and the history written
    timings = run.get("timings") or {}
    finishing = 0.0
    if "pool_s" in timings and "plan_s" in timings:
        after_pool = wall - float(timings["plan_s"]) - float(timings["pool_s"])
        finishing = min(max(after_pool, 0.0) * len(lanes), idle - before_first)
    # work done beside the lanes, on cores they left idle: not in the capacity, said apart
    pre = run.get("triton_precompile") or {}
    beside = {k: pre[k] for k in PRECOMPILE_FIELDS if k in pre} if pre.get("processes") else {}
    return {
        "beside_lanes": {"triton_precompile": beside} if beside else {},
        "wall_s": round(wall, 2),
        "cells_ran": len(ran),
        "cells_cached": len(cached),
        "controls_ran": len(controls_ran),
        "lanes": lanes,
        "capacity_s": round(capacity, 2),
        "work_s": {k: round(v, 2) for k, v in per.items()},
        "harness_s": round(harness, 2),
        "harness_share": round(harness / capacity, 4) if capacity else 0.0,
        "harness_parts_s": {
            "fork-server imports (summed, in parallel)": round(preload, 2),
            "worker start-up (summed, partly hidden)": round(startup, 2),
            "cell set-up outside checks": round(max(cell_s - accounted, 0.0), 2),
            # a lane blocked while another lane builds or compiles what its cell needs (each
            # library and kernel is built once: cuda_build's and tritoncache's locks)
            "waiting on another lane's build or compile": round(waits, 2),
            "lanes idle before their first worker was ready": round(before_first, 2),
            "lanes idle after it": round(idle - before_first - finishing, 2),
            "lanes idle while the run writes its results": round(finishing, 2),
        },
        "workers_started": len(workers),
        # each op's cells on their lanes (set-up included), largest first: a change to one op re-runs
        # its share, so ``by_op_s[op] / len(lanes)`` is the least wall a run of that op alone can take
        "by_op_s": {op: round(secs, 2) for op, secs in sorted(by_op.items(), key=lambda kv: -kv[1])},
    }


def format_beside(b: Mapping[str, Any]) -> str:
    """The work a breakdown did beside its lanes (Triton variants compiled ahead), or ""."""
    pre = (b.get("beside_lanes") or {}).get("triton_precompile") or {}
    if not pre:
        return ""
    when = ""
    if "ready_s" in pre:
        when = f", imports done {pre['ready_s']:.2f} s in, last {pre['last_compiled_s']:.2f} s in"
    ops = ", ".join(f"{tag} {n}" for tag, n in (pre.get("ops") or {}).items())
    return (
        f"{pre.get('compiled', 0)} Triton variants compiled ahead ({ops}) by {pre['processes']} "
        f"process(es){when}; {pre.get('failed', 0)} failed, {pre.get('unfinished', 0)} unfinished"
    )


def format_breakdown(b: Mapping[str, Any]) -> str:
    cap = float(b["capacity_s"]) or 1.0
    head = (
        f"wall {b['wall_s']:.1f} s, {len(b['lanes'])} busy lane(s) -> capacity {b['capacity_s']:.1f} lane-s; "
        f"{b['cells_ran']} cells ran, {b['cells_cached']} cached, {b['workers_started']} workers started"
    )
    lines = [head]
    for name, secs in b["work_s"].items():
        lines.append(f"  {name:<12} {secs:9.1f} s  {100 * secs / cap:5.1f}%")
    lines.append(f"  {'harness':<12} {b['harness_s']:9.1f} s  {100 * b['harness_share']:5.1f}%")
    for name, secs in b["harness_parts_s"].items():
        lines.append(f"    {name}: {secs:.1f} s")
    beside = format_beside(b)
    if beside:
        lines.append(f"  beside the lanes: {beside}")
    by_op = b.get("by_op_s") or {}
    if by_op:
        total = sum(by_op.values()) or 1.0
        top = list(by_op.items())[:8]
        shown = ", ".join(f"{op} {secs:.1f} s ({100 * secs / total:.0f}%)" for op, secs in top)
        more = f", {len(by_op) - 8} more" if len(by_op) > 8 else ""
        lines.append(f"  cell time by op: {shown}{more}")
    return "\n".join(lines)
