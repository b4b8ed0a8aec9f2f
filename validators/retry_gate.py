"""A cell that failed in a controlled mode is re-run only once its control says the mode works here.

A re-run tells a flaky op from a failing one.  When the op's own reference
fails *the same way* in that mode (on the H200 image every AOTInductor package
segfaults in ``aoti_load_package``, custom op or not), the cell is the
environment's (:func:`validators.controls.link`) and a re-run tells nothing:
it costs the cell again (an aoti cell there: about 100 s of compiling before
the crash).  So the first failure of such a cell schedules its control, as the
cell's final failure would, and the cell waits (:class:`RetryGate`); when the
control is in, the cell is re-run if the control passed or failed otherwise,
and recorded as it is if the control failed alike.  A cell whose control cannot
run here, or whose failure no control can explain (wrong numbers, an evidence
failure: :func:`validators.controls.failure_kind` is None), is re-run at once;
"alike" is :func:`validators.controls.fails_alike`, the rule ``link`` applies.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import TYPE_CHECKING

from opgate.validators.attempts import AttemptView, merge_attempts
from opgate.validators.result import CellResult

if TYPE_CHECKING:
    from opgate.matrix.cell import Cell
    from opgate.validators.pool import Task


def provisional(cell: Cell, views: list[AttemptView]) -> CellResult:
    """The cell's result if it were recorded now (to compare with its control; never stored)."""
    verdict, checks, kernels, reason = merge_attempts(views)
    return CellResult(cell, verdict, {}, checks, kernels, reason=reason)


@dataclass
class Parked:
    """A failed attempt's cell waiting for its control before any re-run."""

    task: Task
    views: list[AttemptView]


class RetryGate:
    """The cells waiting on each control, by control id."""

    def __init__(self) -> None:
        self._waiting: dict[str, list[Parked]] = collections.defaultdict(list)

    def park(self, control_id: str, task: Task, views: list[AttemptView]) -> None:
        self._waiting[control_id].append(Parked(task, views))

    def release(self, control_id: str) -> list[Parked]:
        """The cells that waited on ``control_id`` (now in), and none of them again."""
        return self._waiting.pop(control_id, [])

    def leftover(self) -> list[Parked]:
        """Cells still waiting when the pool ran dry (a control that never reported)."""
        left = [p for parked in self._waiting.values() for p in parked]
        self._waiting.clear()
        return left
