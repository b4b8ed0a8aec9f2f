"""opgate's matrix stage: axes (YAML) -> immutable cells.

Importing ``matrix`` stays cheap (no torch, no op import), because every
stage — including the plan job on a bare CI runner — starts here.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opgate.matrix.cell import Cell

__all__ = ["installed_torch", "load_cells", "narrow"]


def installed_torch() -> str:
    """Version of the installed torch distribution, read from metadata (never ``import torch``)."""
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return "none"


def load_cells(
    config_path: Path | None = None,
    ops_paths: Sequence[Path] = (),
    select: Sequence[str] = (),
    skip: Sequence[str] = (),
    torch_version: str | None = None,
) -> list[Cell]:
    """Config + discovered specs -> cells, with command-line ``select``/``skip`` applied last.

    ``torch_version`` stands in for the installed torch (a plan made on a
    machine without the shard's torch); by default it is read from metadata.
    Raises ``SelectionEmpty`` when the command-line globs leave nothing.
    """
    from opgate.matrix.config import load_config
    from opgate.matrix.expand import expand
    from opgate.ops.spec import load_specs

    config = load_config(config_path)
    cells = expand(config, load_specs(ops_paths), torch_version or installed_torch())
    return narrow(cells, select, skip)


def narrow(cells: Sequence[Cell], select: Sequence[str] = (), skip: Sequence[str] = ()) -> list[Cell]:
    """Command-line ``--select``/``--skip`` over expanded cells; nothing left is ``SelectionEmpty``."""
    from opgate.matrix import cell as cellmod
    from opgate.matrix.errors import SelectionEmpty

    chosen = cellmod.select(cells, select, skip)
    if not chosen:
        globs = " ".join([*(f"--select {g}" for g in select), *(f"--skip {g}" for g in skip)])
        raise SelectionEmpty(f"{globs}: no cell left of {len(cells)} (see `opgate list`)")
    return chosen
