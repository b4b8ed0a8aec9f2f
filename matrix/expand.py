"""Config x op specs -> cells: one pure function, so the matrix is reproducible.

``expand`` reads nothing but its arguments (the caller resolves the installed
torch version), and returns cells sorted by id: the same inputs always give
the same list, on any machine, which is what lets a plan made on one machine
be run as shards on others.

Rules, in order:

* ops / implementations: config globs over discovered specs (a glob that
  matches nothing is a config error: it is a typo, not an empty wish);
* torch: ``installed`` -> the caller's version; versions sharing a
  major.minor are one id column, and ``installed`` wins over a listed version
  of the same column (so ``[installed, "2.11.0"]`` works in the 2.11 session);
* arch ``cpu`` has cuda ``none``; each GPU arch gets one cell per cuda version;
* dtype / layout / mode: config values the implementation claims
  (implementation lists narrow the op's); ``gpu_only`` modes (cudagraphs, build:
  :mod:`opgate.matrix.modes`) only on GPU arches; ``binaries`` modes (build) only
  for kinds triton/cuda and external implementations
  whose spec names ``binaries``, once per
  op/impl/torch/cuda/arch with dtype and layout ``all``;
* shapes: config shape sets the op defines (a set no selected op defines is an error);
* cells the spec declares unsupported are kept: validators check the declared refusal;
* config select/skip, then overrides (later overrides win per key; tolerance per field).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from typing import Any

from opgate.matrix.cell import NOT_APPLICABLE, Cell, matches, select, torch_major_minor
from opgate.matrix.config import INSTALLED, MatrixConfig
from opgate.matrix.errors import ConfigError, SelectionEmpty
from opgate.matrix.modes import mode as mode_of
from opgate.matrix.schema import Problems, did_you_mean
from opgate.matrix.spec import ImplSpec, OpSpec

BUILD_KINDS = frozenset({"triton", "cuda"})
NO_TORCH = "none"


def torch_columns(config: MatrixConfig, installed_torch: str) -> list[str]:
    """Resolved torch versions, one per major.minor id column."""
    columns: dict[str, str] = {}
    for i, value in enumerate(config.torch):
        if value == INSTALLED:
            continue
        mm = torch_major_minor(value)
        if mm in columns:
            raise ConfigError(
                f"torch: {columns[mm]!r} and {value!r} share the id column pt{mm}",
                config.where(f"torch[{i}]"),
                "list each torch major.minor once",
            )
        columns[mm] = value
    if INSTALLED in config.torch:
        columns[torch_major_minor(installed_torch)] = installed_torch
    return list(columns.values())


def _check_globs(
    key: str, globs: Sequence[str], names: Sequence[str], config: MatrixConfig, problems: Problems
) -> None:
    """A config glob that matches nothing is a typo: say which and suggest a name."""
    for i, glob in enumerate(globs):
        if not any(fnmatch.fnmatchcase(n, glob) for n in names):
            hint = did_you_mean(glob, names) or f"known: {', '.join(names) or 'none'}"
            problems.add(config.where(f"{key}[{i}]"), f"{key}: {glob!r} matches nothing", hint)


def _gpu_cudas(config: MatrixConfig) -> list[str]:
    """Runtime cuda versions, then build-only ones (``build_cuda``) not already listed."""
    return [*config.cuda, *(c for c in config.build_cuda if c not in config.cuda)]


def _impl_cells(config: MatrixConfig, spec: OpSpec, impl: ImplSpec, torches: Sequence[str]) -> list[Cell]:
    dtypes = [d for d in config.dtype if d in impl.dtypes]
    layouts = [lay for lay in config.layout if lay in impl.layouts]
    modes = [m for m in config.mode if m in impl.modes]
    shape_sets = [s for s in config.shapes if s in spec.shapes]
    cells: list[Cell] = []
    for torch in torches:
        for arch in config.arch:
            cudas = [NOT_APPLICABLE["cuda"]] if arch == "cpu" else _gpu_cudas(config)
            for cuda in cudas:
                at = (spec.op, impl.name, torch, cuda, arch)
                for mode in modes:
                    binaries = mode_of(mode).binaries
                    if mode_of(mode).gpu_only and arch == "cpu":
                        continue
                    if not binaries and arch != "cpu" and cuda not in config.cuda:
                        continue  # a build_cuda version: binary evidence only
                    if binaries:
                        if impl.kind in BUILD_KINDS or impl.audits_binaries:
                            cells.append(Cell(*at, NOT_APPLICABLE["dtype"], NOT_APPLICABLE["layout"], mode))
                        continue
                    cells += [
                        Cell(*at, dtype=d, layout=lay, mode=mode, shapes=s)
                        for d in dtypes
                        for lay in layouts
                        for s in shape_sets
                    ]
    return cells


def _with_overrides(cell: Cell, config: MatrixConfig) -> Cell:
    merged: dict[str, Any] = {}
    for ov in config.overrides:
        if fnmatch.fnmatchcase(cell.id, ov.select):
            for key, value in ov.settings:
                merged[key] = {**merged.get(key, {}), **value} if isinstance(value, dict) else value
    if not merged:
        return cell
    return Cell(**cell.axes(), overrides=tuple(sorted(merged.items())))


def expand(config: MatrixConfig, specs: Mapping[str, OpSpec], installed_torch: str) -> list[Cell]:
    """All cells of ``config`` over ``specs``, sorted by id (config select/skip applied)."""
    problems = Problems()
    op_names = sorted(specs)
    _check_globs("ops", config.ops, op_names, config, problems)
    chosen = [specs[n] for n in op_names if matches(n, config.ops)]
    problems.raise_if_any()  # no op: implementation and shape checks would only add noise
    impl_names = sorted({i for s in chosen for i in s.implementations})
    _check_globs("implementations", config.implementations, impl_names, config, problems)
    shape_names = sorted({k for s in chosen for k in s.shapes})
    for i, name in enumerate(config.shapes):
        if name not in shape_names:
            hint = did_you_mean(name, shape_names) or f"the selected ops define: {', '.join(shape_names)}"
            problems.add(
                config.where(f"shapes[{i}]"), f"shapes: no selected op defines shape set {name!r}", hint
            )
    problems.raise_if_any()
    torches = torch_columns(config, installed_torch)

    every: list[Cell] = []
    for spec in chosen:
        for name in sorted(spec.implementations):
            if matches(name, config.implementations):
                every += _impl_cells(config, spec, spec.implementations[name], torches)
    for ov in config.overrides:
        if not any(fnmatch.fnmatchcase(c.id, ov.select) for c in every):
            problems.add(
                ov.where, f"overrides: {ov.select!r} matches no cell", "check the glob against `matrix list`"
            )
    problems.raise_if_any()

    kept = select(every, config.select, config.skip)
    if not kept:
        raise SelectionEmpty(
            f"{config.path}: select/skip leave none of the {len(every)} cells"
            if every
            else f"{config.path}: the matrix is empty (no implementation claims these dtypes/layouts/modes)"
        )
    return sorted((_with_overrides(c, config) for c in kept), key=lambda c: c.id)
