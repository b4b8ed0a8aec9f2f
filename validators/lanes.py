"""What the worker pool schedules: tasks (attempts at cells), their outcomes, and lanes.

Kept apart from the scheduler (:mod:`validators.pool`) so the data it moves
around can be read, and imported (the runner, the attempt merger), without
the event loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opgate.matrix.cell import Cell
from opgate.validators.device import Gpu
from opgate.validators.result import CheckResult, Verdict, combine
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
    contain: bool = False  # retire the (reusable) worker unless this cell passes


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
    name: str
    gpu: Gpu | None = None
    reusable: WorkerProcess | None = None
    spare: WorkerProcess | None = None
    current: WorkerProcess | None = None
    task: Task | None = None
    sent_at: float = 0.0
    deadline: float = 0.0

    def can_run(self, task: Task) -> bool:
        if self.gpu is None:
            return task.kind in ("cpu", "build")
        return task.kind == "cuda" and task.arch == self.gpu.arch


def all_ok(outcome: dict[str, Any]) -> bool:
    """The attempt's verdict is not bad (``Verdict.is_bad``), from the worker's wire outcome.

    The worker may leave the verdict to its checks (``verdict`` None): then it is
    :func:`validators.result.combine` of them, as for the recorded result.
    """
    try:
        raw = outcome.get("verdict")
        checks = [CheckResult.from_json(c) for c in outcome.get("checks") or []]
        verdict = Verdict(raw) if raw else combine(checks)
    except (KeyError, TypeError, ValueError):
        return False  # an outcome that does not parse is the cell's error
    return not verdict.is_bad


def usable(worker: WorkerProcess | None, kind: str) -> bool:
    return worker is not None and worker.kind == kind and worker.alive
