"""opgate's matrix stage: axes (YAML) -> immutable cells.

Importing ``matrix`` stays cheap (no torch, no op import), because every
stage — including the plan job on a bare CI runner — starts here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opgate.matrix.cell import Cell
    from opgate.matrix.config import MatrixConfig
    from opgate.matrix.spec import OpSpec

__all__ = ["expand_torches", "installed_torch", "load_cells", "narrow"]


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
    torch_version: str | Sequence[str] | None = None,
) -> list[Cell]:
    """Config + discovered specs -> cells, with command-line ``select``/``skip`` applied last.

    ``torch_version`` stands in for the installed torch (a plan made on a
    machine without the shard's torch); by default it is read from metadata.
    Several versions expand the matrix once for each (a CI plan for several torch
    releases).  Raises ``SelectionEmpty`` when the command-line globs leave nothing.
    """
    from opgate.matrix.config import load_config
    from opgate.matrix.spec import load_specs

    config = load_config(config_path)
    return narrow(expand_torches(config, load_specs(ops_paths), torch_version), select, skip)


def expand_torches(
    config: MatrixConfig, specs: Mapping[str, OpSpec], torch: str | Sequence[str] | None
) -> list[Cell]:
    """The matrix expanded with each torch version standing in for ``installed``, each cell once."""
    from opgate.matrix.expand import expand

    versions = [torch] if isinstance(torch, str) else list(torch or []) or [installed_torch()]
    cells: dict[str, Cell] = {}
    for version in versions:
        for cell in expand(config, specs, version):
            cells.setdefault(cell.id, cell)
    return list(cells.values())


def narrow(cells: Sequence[Cell], select: Sequence[str] = (), skip: Sequence[str] = ()) -> list[Cell]:
    """Command-line ``--select``/``--skip`` over expanded cells; nothing left is ``SelectionEmpty``."""
    from opgate.matrix import cell as cellmod
    from opgate.matrix.errors import SelectionEmpty

    chosen = cellmod.select(cells, select, skip)
    if not chosen:
        globs = " ".join([*(f"--select {g}" for g in select), *(f"--skip {g}" for g in skip)])
        raise SelectionEmpty(f"{globs}: no cell left of {len(cells)} (see `opgate list`)")
    return chosen
