"""Every kind of evidence that a custom op really works, per cell.

Entry point (called by the runner's worker process, never by the parent, so
nothing here imports torch at module import)::

    run_cell(cell, spec, device, seed, workdir) -> CellOutcome

Each check is a small module exposing ``CHECKS``: a tuple of
:class:`validators.checks.base.Check` (``name``, ``applies(ctx) -> str | None``,
``run(ctx) -> CheckResult``).  Each mode lists its checks, in run order, in
its entry of :mod:`opgate.matrix.modes` (``Mode.checks``; ``build`` cells are
delegated to ``validators.checks.build.run_cell``); a mode's own check, named
like the mode, builds and judges its artifact (:mod:`.artifacts`).  That mode
table is the one place the list lives; README.md's "The checks" section describes it.

Compile, cudagraphs and export cells run the op inside a small graph with a
producer and a consumer (:mod:`validators.checks.opgraph`), the reference
through the same context.  A GPU cell whose kernel evidence was not checked is
never ``pass``.

A cell the spec declares unsupported runs the ``limits`` check alone.  Before
any check, the reference's float64 oracle is audited (:mod:`.oracle`): a
reference whose oracle is not float64 makes the cell ``error`` naming its line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from opgate.validators.result import CheckResult, Verdict

if TYPE_CHECKING:
    from opgate.matrix.cell import Cell
    from opgate.matrix.spec import OpSpec


@dataclass
class CellOutcome:
    """What the worker reports for a cell; ``verdict`` None means ``combine(checks)``."""

    checks: list[CheckResult]
    kernels: list[str] = field(default_factory=list)
    reason: str = ""
    verdict: Verdict | None = None
    #: seconds of the set-up spent building the op's CUDA extension: build work, which the run
    #: breakdown must not count as set-up
    setup_build_s: float = 0.0
    #: seconds of the set-up blocked while another process built it: the lane did nothing (the
    #: breakdown's "waiting on another lane's build or compile")
    setup_wait_s: float = 0.0


def run_cell(cell: Cell, spec: OpSpec, device: str, seed: int, workdir: Path) -> CellOutcome:
    """Run every applicable check of ``cell`` on ``device`` ("cpu" or "cuda:N") with inputs from ``seed``.

    Never raises for a Python exception inside a check or the op (that check
    becomes ``error``); a native crash (segfault) or a hang takes the worker
    process down, which the runner records as the cell's ``error``.
    """
    from opgate.validators.checks.cell import run_cell as _run_cell

    return _run_cell(cell, spec, device, seed, workdir)


__all__ = ["CellOutcome", "run_cell"]
