"""Run zoo cells in-process, the way the runner's worker does (for tests).

Imported by ``tests/zoo_cases.py`` (the zoo files) and ``tests/test_checks_*.py``.  Sets
TRITON_INTERPRET before anything imports triton, like a CPU worker.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING

os.environ.setdefault("TRITON_INTERPRET", "1")

if TYPE_CHECKING:
    from opgate.matrix.cell import Cell
    from opgate.matrix.spec import OpSpec
    from opgate.validators.checks import CellOutcome
    from opgate.validators.result import Verdict

ZOO = Path(__file__).resolve().parent


@functools.cache
def specs() -> dict[str, OpSpec]:
    from opgate.matrix.spec import load_specs

    return load_specs([ZOO])


def make_cell(
    op: str, dtype: str, layout: str, mode: str, *, impl: str = "triton", shapes: str = "default"
) -> Cell:
    import torch

    from opgate.matrix.cell import Cell

    return Cell(
        op=op, impl=impl, torch=torch.__version__, cuda="none", arch="cpu",
        dtype=dtype, layout=layout, mode=mode, shapes=shapes,
    )  # fmt: skip


def run(cell: Cell, workdir: Path, seed: int = 1234) -> tuple[Verdict, CellOutcome]:
    """(cell verdict, outcome) of one cell run through the agreed entry point on CPU."""
    from opgate.validators.checks import run_cell
    from opgate.validators.result import combine

    outcome = run_cell(cell, specs()[cell.op], "cpu", seed, workdir / cell.id)
    return (outcome.verdict or combine(outcome.checks)), outcome
