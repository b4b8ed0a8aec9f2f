"""What the worker pool schedules: tasks (attempts at cells), their outcomes, and lanes.

Kept apart from the scheduler (:mod:`validators.pool`) so the data it moves
around can be read, and imported (the runner, the attempt merger), without
the event loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opgate.matrix.cell import Cell
from opgate.validators.device import Gpu
from opgate.validators.workerproc import WorkerProcess

#: The kinds of cell a host lane runs (no GPU: compiled or interpreted on the host).
HOST_KINDS = ("cpu", "build")


@dataclass
class Task:
    """One attempt at one cell."""

    cell: Cell
    kind: str  # cpu | cuda | build
    arch: str
    seed: int
    timeout_s: float
    log: Path
    workdir: Path
    attempt: int = 1
    memory_mb: int | None = None  # the worker's private-memory limit while it runs this cell
    fresh: bool = False  # run in a throw-away worker


@dataclass
class Attempt:
    """What one attempt produced: the worker's outcome, or why there is none."""

    outcome: dict[str, Any]
    duration_s: float
    worker: str = ""
    timed_out: bool = False
    retryable: bool = True
    #: the worker was killed from outside the cell (workerproc.killed_from_outside): never flaky
    external: bool = False


@dataclass
class Lane:
    """One cell at a time: a host lane runs cpu and build cells, a GPU lane its GPU's cuda cells.

    A host lane given a ``gpu`` *borrows* it: it takes that GPU's cuda cells
    once no host cell is waiting (:meth:`pick`), so on a GPU machine the build
    lanes do not sit idle after the builds.  The other way round, a GPU lane
    that ``lends`` takes host cells while none of its own can start: while the
    cuda fork server imports Dynamo and Inductor (10-14 s on the H200), six
    GPU lanes otherwise waited beside two host lanes working through the
    builds.  The pool lends only where several workers share each GPU already:
    a run that gives a GPU one worker keeps it so, both ways.
    """

    name: str
    gpu: Gpu | None = None
    host: bool = False
    #: a GPU lane that takes host cells while none of its own can start (see above)
    lends: bool = False
    reusable: WorkerProcess | None = None
    spare: WorkerProcess | None = None
    current: WorkerProcess | None = None
    task: Task | None = None
    sent_at: float = 0.0
    deadline: float = 0.0

    def can_run(self, task: Task) -> bool:
        """Whether the task is this lane's own (a host lane's borrowed cuda cells count)."""
        if task.kind in HOST_KINDS:
            return self.host
        return task.kind == "cuda" and self.gpu is not None and task.arch == self.gpu.arch

    def pick(self, pending: Iterable[Task], startable: Callable[[Task], bool] | None = None) -> Task | None:
        """The next task for this lane: its own cells before any it may borrow.

        With ``startable``, only tasks it accepts (their worker can start now):
        a lane takes a build cell while the cuda server still imports, rather
        than wait for it.  Without it (planning the next worker) a GPU lane
        borrows nothing: it is its own cells it prepares for.
        """
        borrowed = None
        for task in pending:
            own = self.can_run(task)
            if not (own or (self.lends and startable is not None and task.kind in HOST_KINDS)):
                continue
            if startable is not None and not startable(task):
                continue
            if own and not (self.host and task.kind == "cuda"):
                return task
            borrowed = borrowed or task
        return borrowed


def gpu_lanes(gpus: Sequence[Gpu], gpu_workers: int) -> list[tuple[str, Gpu]]:
    """The GPU lanes' names and GPUs, in the order the pool fills them: ``gpu0``, ``gpu1``, ``gpu0.1``..."""
    return [(f"gpu{g.index}" + (f".{k}" if k else ""), g) for k in range(max(1, gpu_workers)) for g in gpus]


def usable(worker: WorkerProcess | None, kind: str) -> bool:
    return worker is not None and worker.kind == kind and worker.alive
