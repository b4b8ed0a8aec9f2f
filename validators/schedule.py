"""Which cell goes first and how many lanes a run opens: the expected cost of each cell, measured.

A run ends when its last lane finishes, so the cells that take longest must
start first (longest processing time first: with the lanes fed greedily
from that order, no lane is left compiling alone at the end), and a lane
that has nothing to do for most of the run should not be opened at all: its
worker costs start-up, memory and CPU, and it counts as idle capacity.

The cost of a cell is what it took the last time it ran in this environment
(:class:`History`, kept beside the verdict cache, one file per environment
identity), else the median of its (arch, mode) peers in that history, else
a per-mode default (:func:`opgate.matrix.plan.estimate`, the same estimate the
CI plan balances shards with).  A cell the verdict cache could not serve
because its op changed will also find its kernels changed: it is expected to
cost the most it ever took here (its cold compile), not its last, warm, run.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opgate.matrix.cell import Cell
from opgate.matrix.files import exclusive
from opgate.matrix.plan import estimate
from opgate.validators.cache import identity_digest

if TYPE_CHECKING:
    from opgate.validators.lanes import Task

HISTORY_VERSION = 1
#: Cells whose expected costs are within this factor of each other form one tier, in which
#: (op, impl) groups take turns (two tiers per doubling).
TIER_BASE = math.sqrt(2.0)


@dataclass
class History:
    """Per-cell durations (s) of the last runs in one environment, read and written as JSON."""

    path: Path | None
    durations: dict[str, float]  # the last run of each cell
    #: the environment's last fingerprint: a run that starts no worker still writes a real one
    fingerprint: dict[str, Any] = field(default_factory=dict)
    peaks: dict[str, float] = field(default_factory=dict)  # the longest run of each cell
    #: what this process measured (:meth:`update`): all :meth:`save` writes over the file's figures
    measured: dict[str, float] = field(default_factory=dict)

    @classmethod
    def load(cls, root: Path, identity: Mapping[str, Any]) -> History:
        """The history of environment ``identity`` under ``root`` (empty when absent or unreadable)."""
        path = root / "durations" / f"{identity_digest(identity)}.json"
        data = _read(path)
        return cls(path, data.get("durations", {}), data.get("fingerprint", {}), data.get("peaks", {}))

    def update(self, durations: Mapping[str, float]) -> None:
        """Record what cells that ran took (cached cells keep their earlier figure)."""
        ran = {k: round(float(v), 3) for k, v in durations.items() if v > 0}
        self.durations.update(ran)
        self.measured.update(ran)
        self.peaks.update({k: max(v, self.peaks.get(k, 0.0)) for k, v in ran.items()})

    def save(self) -> None:
        """Merge what this run measured into the file and replace it atomically, one run at a time.

        Only this run's own figures overwrite the file's: a run sharing the
        cache (another ``--out``, a CI shard) that saved meanwhile keeps the
        durations it measured, instead of getting back the ones this run loaded
        at its start; a peak is the longer of the two.
        """
        if self.path is None:
            return
        with exclusive(self.path.with_name(f"{self.path.name}.lock")):
            on_disk = _read(self.path)
            peaks = dict(on_disk.get("peaks", {}))
            for cell, seconds in self.measured.items():
                peaks[cell] = max(seconds, self.peaks.get(cell, 0.0), peaks.get(cell, 0.0))
            doc = {
                "version": HISTORY_VERSION,
                "durations": {**(on_disk.get("durations") or self.durations), **self.measured},
                "peaks": peaks or self.peaks,
                "fingerprint": self.fingerprint,
            }
            tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(doc, sort_keys=True))
            tmp.replace(self.path)


def _read(path: Path) -> dict[str, Any]:
    """``{"durations": {id: s}, "fingerprint": {...}}`` from a history file; {} when unusable."""
    try:
        data = json.loads(path.read_text())
        if data.get("version") != HISTORY_VERSION:
            return {}
        durations = {str(k): float(v) for k, v in data["durations"].items()}
        peaks = {str(k): float(v) for k, v in (data.get("peaks") or {}).items()}
        fingerprint = data.get("fingerprint")
        return {
            "durations": durations,
            "peaks": peaks,
            "fingerprint": dict(fingerprint) if isinstance(fingerprint, dict) else {},
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def expected_costs(
    cells: Sequence[Cell], history: History | Mapping[str, float], changed: Iterable[str] = ()
) -> dict[str, float]:
    """Seconds per cell id: measured here before, else its peers' median, else the mode's default.

    ``changed`` cells (their op's sources changed since) are expected at their peak.
    """
    if not isinstance(history, History):
        return estimate(cells, history)
    peak = set(changed)
    durations = {k: history.peaks.get(k, v) if k in peak else v for k, v in history.durations.items()}
    return estimate(cells, durations)


def _tier(cost: float) -> int:
    return math.floor(math.log(max(cost, 1e-3), TIER_BASE))


def longest_first(cells: Sequence[Cell], costs: Mapping[str, float] | None = None) -> list[Cell]:
    """Cells by expected cost, most expensive first; within a tier, (op, impl) groups take turns.

    Taking turns keeps the lanes from all starting on one CUDA C++ op at once
    and then waiting on its (locked, minute-long) cold build together.  The
    order is otherwise the given one (stable), so equal cells keep matrix order.
    """
    costs = costs if costs is not None else expected_costs(cells, {})
    tiers: dict[int, dict[tuple[str, str], list[Cell]]] = {}
    for cell in cells:
        tier = tiers.setdefault(-_tier(costs[cell.id]), {})
        tier.setdefault((cell.op, cell.impl), []).append(cell)
    ordered: list[Cell] = []
    for tier_key in sorted(tiers):
        groups = list(tiers[tier_key].values())
        for turn in range(max(len(g) for g in groups)):
            ordered.extend(g[turn] for g in groups if turn < len(g))
    return ordered


def prerequisites(
    tasks: Sequence[Task], specs: Mapping[str, Any], built: Callable[[str, Any, Any], bool] = lambda *_: False
) -> dict[str, frozenset[str]]:
    """GPU cells -> the build cells of this run that build what they load: start them after those.

    A CUDA C++ implementation's GPU cells load the library its build cells
    build; an implementation that declares ``libraries`` loads those, which
    the build cells of every implementation declaring the same library start
    (the first builds it, the others leave it to that one).  Before them, a
    GPU cell would block on the build lock: on the H200 a cold run's first
    GPU cells waited 23 s on five lanes for one library.  The pool holds such
    a cell back until those build cells say it is built
    (:class:`validators.pool.Pool`).  ``built(name, sources, impl)`` says a
    library is in the build cache already (then nothing waits for it).
    """
    from opgate.validators.cuda_build import library_name

    looked: dict[tuple[str, tuple[str, ...], str], bool] = {}  # one look per library, not per cell

    def in_cache(name: str, sources: Any, impl: Any) -> bool:
        key = (name, tuple(str(s) for s in sources), repr(getattr(impl, "arch_policy", None)))
        if key not in looked:
            looked[key] = built(name, sources, impl)
        return looked[key]

    builds: dict[tuple[str, str], list[str]] = {}
    makes: dict[str, set[str]] = {}  # library name -> the build cells that build it
    for task in tasks:
        if task.kind != "build":
            continue
        builds.setdefault((task.cell.op, task.cell.impl), []).append(task.cell.id)
        impl = _impl(specs, task.cell.op, task.cell.impl)
        for lib in getattr(impl, "libraries", ()):
            makes.setdefault(lib.name, set()).add(task.cell.id)
    after: dict[str, frozenset[str]] = {}
    for task in tasks:
        if task.kind != "cuda":
            continue
        impl = _impl(specs, task.cell.op, task.cell.impl)
        need: set[str] = set()
        own = library_name(task.cell.op, task.cell.impl)
        if getattr(impl, "kind", "") == "cuda" and not in_cache(own, impl.sources, impl):
            need |= set(builds.get((task.cell.op, task.cell.impl), ()))
        for lib in getattr(impl, "libraries", ()):
            if not in_cache(lib.name, lib.sources, impl):
                need |= makes.get(lib.name, set())
        if need:
            after[task.cell.id] = frozenset(need)
    return after


def _impl(specs: Mapping[str, Any], op: str, impl: str) -> Any:
    spec = specs.get(op)
    return None if spec is None else spec.implementations.get(impl)


def lanes_needed(costs: Iterable[float], lanes: int, makespan_s: float = 0.0) -> int:
    """How many of ``lanes`` a set of cells keeps busy: no more than cells, none idle most of the run.

    ``makespan_s`` is how long the run lasts anyway (the GPU lanes' share of
    their own cells): host cells that fit into fewer lanes within it get fewer.
    Greedy LPT packing into k lanes finishes within ``total / k + longest``.
    """
    work = sorted((max(c, 0.0) for c in costs), reverse=True)
    if not work:
        return 0
    top = min(lanes, len(work))
    if makespan_s <= 0:
        return top
    for k in range(1, top + 1):
        if sum(work) / k + work[0] * (1 - 1 / k) <= makespan_s:
            return k
    return top


def gpu_makespan(costs: Iterable[float], lanes: int) -> float:
    """How long ``lanes`` GPU lanes take for cells of these expected costs (LPT bound)."""
    work = sorted(costs, reverse=True)
    if not work or lanes <= 0:
        return 0.0
    return max(sum(work) / lanes, work[0])


def host_lanes(
    tasks: Sequence[Task],
    costs: Mapping[str, float],
    jobs: int,
    gpu_lanes: int,
    history: History,
    *,
    lend: bool = False,
) -> int:
    """Host lanes (cpu and build cells) to open: ``--jobs``, fewer where measured costs say they would idle.

    Beside GPU lanes, the host cells (build cells on a GPU machine) need only
    as many lanes as finish them within the GPU lanes' own share; a second
    build lane idling for most of the run is capacity nobody uses.  Only
    measured costs shrink the count: defaults are guesses.  Where the pool
    ``lend``s the GPUs to host lanes (:class:`validators.lanes.Lane`), a host
    lane with no host cell left runs cuda cells: none idles, all are opened.
    """
    host = [costs[t.cell.id] for t in tasks if t.kind != "cuda"]
    cuda = [costs[t.cell.id] for t in tasks if t.kind == "cuda"]
    if lend and cuda:
        return max(1, min(jobs, len(tasks)))
    if not host:
        return 1
    measured = all(t.cell.id in history.durations for t in tasks)
    if not measured or not cuda or gpu_lanes <= 0:
        return min(jobs, len(host))
    return lanes_needed(host, jobs, gpu_makespan(cuda, gpu_lanes))
