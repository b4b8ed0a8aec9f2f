"""What the worker pool schedules: tasks (attempts at cells), their outcomes, and lanes.

Kept apart from the scheduler (:mod:`validators.pool`) so the data it moves
around can be read, and imported (the runner, the attempt merger), without
the event loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opgate.matrix.cell import Cell
from opgate.validators.device import Gpu
from opgate.validators.workerproc import WorkerProcess


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
    lanes do not sit idle after the builds (the pool lends only where several
    workers share each GPU already: a run that gives a GPU one worker keeps it so).
    """

    name: str
    gpu: Gpu | None = None
    host: bool = False
    reusable: WorkerProcess | None = None
    spare: WorkerProcess | None = None
    current: WorkerProcess | None = None
    task: Task | None = None
    sent_at: float = 0.0
    deadline: float = 0.0

    def can_run(self, task: Task) -> bool:
        if task.kind in ("cpu", "build"):
            return self.host
        return task.kind == "cuda" and self.gpu is not None and task.arch == self.gpu.arch

    def pick(self, pending: Iterable[Task], startable: Callable[[Task], bool] | None = None) -> Task | None:
        """The next task for this lane: a host lane's own cells before any cuda cell it may borrow.

        With ``startable``, only tasks it accepts (their worker can start now):
        a lane takes a build cell while the cuda server still imports, rather
        than wait for it.
        """
        borrowed = None
        for task in pending:
            if self.can_run(task) and (startable is None or startable(task)):
                if not (self.host and task.kind == "cuda"):
                    return task
                borrowed = borrowed or task
        return borrowed


def usable(worker: WorkerProcess | None, kind: str) -> bool:
    return worker is not None and worker.kind == kind and worker.alive
