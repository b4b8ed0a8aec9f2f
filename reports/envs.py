"""Release-table columns: which torch / CUDA / arch a cell's verdict is shown under.

A cell id already names torch major.minor, CUDA and arch; the column groups
cells by those.  Which *machine* really ran a cell is the environment key, a
different thing: :class:`opgate.validators.env.Fingerprint` defines both the
record and its key, for the writer (the workers) and every reader here.
"""

from __future__ import annotations

import re
from typing import Any

from opgate.matrix.cell import Cell, torch_major_minor


def column_of(cell: Cell) -> str:
    """Release-table column for a cell: torch major.minor, CUDA, arch ("pt2.11 cu13.0 sm_90")."""
    torch_mm = f"pt{torch_major_minor(cell.torch)}"
    if cell.arch == "cpu":
        return f"{torch_mm} cpu"
    return f"{torch_mm} cu{cell.cuda} {cell.arch}"


def column_sort_key(column: str) -> tuple[Any, ...]:
    """Columns by torch version, then CUDA, with cpu first (numeric, not lexical: 2.9 < 2.13)."""

    def nums(text: str) -> tuple[int, ...]:
        return tuple(int(x) for x in re.findall(r"\d+", text))

    parts = column.split()
    torch_part = nums(parts[0]) if parts else ()
    if len(parts) < 3:
        return (torch_part, 0, (), ())
    return (torch_part, 1, nums(parts[1]), nums(parts[2]))
