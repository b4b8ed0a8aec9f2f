"""What a run starts before its cache lookup: a changed GPU op's precompile and first workers.

Why: on the H200 a one-op run looked up 625 verdicts and asked for its
servers for 0.16 s before either started, and each lane's first cell then
waited in its first launch for the Triton variant being precompiled
(``fake_meta`` 0.5-0.9 s, against 0.02 s in a warm run).  A GPU op whose
sources changed since its variants were stored (:mod:`validators.tritonvariants`)
and whose verdicts are not stored for its sources as they are has cells to
run whatever the lookup finds, so the run need not wait for the lookup to
start what those cells need (``Runner._start_early``).  In the run's own
thread the starts held it ~0.15 s, mostly the warm servers' answers (a warm
server checks its imported files before it answers); in threads of their
own they end with the lookup (``results/runs/h200-early-start``,
``h200-early-start-2``).

Nothing starts for an op whose variants were never stored (its first run
here) or still match its sources, nor for a change taken back (the op's
first GPU cell has a stored verdict): the lookup decides, as before.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opgate.matrix.cell import Cell
from opgate.validators import tritonvariants
from opgate.validators.schedule import History, expected_costs, longest_first


@dataclass(frozen=True)
class EarlyPlan:
    """The changed GPU ops' stored variants, their GPU cells in the lanes' order, and their kinds."""

    variants: tritonvariants.Variants  # op implementation -> the stored variants to precompile
    order: list[str]  # the changed ops' GPU cell ids, longest first (as the lanes will take them)
    builds: bool  # some changed op has build cells (the precompile forks from their server)

    @property
    def gpu_cells(self) -> int:
        return len(self.order)


def plan(
    cells: Sequence[Cell],
    kinds: Mapping[str, str | None],
    specs: Mapping[str, Any],
    cache: Any,
    history: History,
    *,
    may_serve: bool,
) -> EarlyPlan | None:
    """What to start before the lookup (None: nothing). ``kinds``: cell id -> where it runs.

    ``cache`` is the run's verdict cache (its op digests and stored verdicts);
    ``may_serve``: stored verdicts may be served (not ``--no-cache``), so a
    change taken back runs nothing.
    """
    gpu = [c for c in cells if kinds.get(c.id) == "cuda" and c.op in specs]
    digests = {f"{c.op}.{c.impl}": cache.op_digest(specs[c.op]) for c in gpu}
    variants = dict(tritonvariants.Store.beside(cache).changed(digests))
    for tag in list(variants) if may_serve else ():
        first = next(c for c in gpu if f"{c.op}.{c.impl}" == tag)
        if cache.has(first, specs[first.op]):  # validated as it is: nothing of it may run
            del variants[tag]
    if not variants:
        return None
    changed = {c.id for c in cells if f"{c.op}.{c.impl}" in variants}
    mine = [c for c in gpu if c.id in changed]
    order = [c.id for c in longest_first(mine, expected_costs(mine, history, changed))]
    return EarlyPlan(variants, order, builds=any(kinds.get(c) == "build" for c in changed))


class Starts:
    """Each start in a thread of its own, kept alive until :meth:`release` (the run's end).

    :meth:`join` waits for every start's work and raises what one raised.  The
    threads then wait, parked, until the run releases them: a process that asks
    the kernel to kill it when its parent dies (``PR_SET_PDEATHSIG``, every
    worker and fork server, :func:`validators.worker.arm`) is killed when the
    *thread* that started it ends, not the process; a start's thread that
    ended at once killed the fork server or worker it had just started, as
    soon as that process had armed itself.
    """

    def __init__(self, *works: Callable[[], None]) -> None:
        self._raised: list[BaseException] = []
        self._done = [threading.Event() for _ in works]
        self._released = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(w, d), daemon=True, name=f"opgate-early-{i}")
            for i, (w, d) in enumerate(zip(works, self._done, strict=True))
        ]
        for thread in self._threads:
            thread.start()

    def _run(self, work: Callable[[], None], done: threading.Event) -> None:
        try:
            work()
        except BaseException as exc:  # noqa: BLE001 - raised again in the run's thread by join()
            self._raised.append(exc)
        finally:
            done.set()
        self._released.wait()  # the processes this thread started live as long as the run

    def join(self) -> None:
        """Wait for every start's work; raise the first failure (the others as its notes)."""
        for done in self._done:
            done.wait()
        if self._raised:
            first, *others = self._raised
            self._raised = []
            for other in others:
                first.add_note(f"another early start failed too: {type(other).__name__}: {other}")
            raise first

    def release(self) -> None:
        """The run ended (its workers and servers stopped): the threads may end."""
        self._released.set()
        for thread in self._threads:
            thread.join()
        self._threads = []
