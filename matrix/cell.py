"""The unit of work: one cell of the compatibility matrix.

A cell is a frozen dataclass of axis values.  Its ``id`` is the one name used
everywhere — test ids, JUnit, results.json, compat tables, diffs, alerts — so it
must be stable (a pure function of the axis values), readable, and
glob-selectable.  Format::

    {op}.{impl}-pt{torch_mm}-{cuda}-{arch}-{dtype}-{layout}-{mode}[-{shapes}]

    rms_norm.triton-pt2.13-cpu-bf16-transposed-compile          (arch cpu: no cuda part)
    rms_norm.cuda-pt2.11-cu13.0-sm_90-fp16-contiguous-eager
    rms_norm.cuda-pt2.14-cu12.9-sm_80-all-all-build             (build cells: dtype/layout "all")
    rms_norm.triton-pt2.13-cpu-fp32-contiguous-eager-large      (non-default shape set)

``torch_mm`` is major.minor of the torch version: patch releases share one
column.  The full version stays in the ``torch`` axis.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from opgate.matrix.modes import MODE_NAMES

#: Axis names in id order.  Adding an axis is a format change: bump CELL_ID_VERSION.
AXES: tuple[str, ...] = ("op", "impl", "torch", "cuda", "arch", "dtype", "layout", "mode", "shapes")
CELL_ID_VERSION = 1

ARCHES: tuple[str, ...] = ("cpu", "sm_80", "sm_90")
DTYPES: tuple[str, ...] = ("fp32", "fp16", "bf16")
IMPLS: tuple[str, ...] = ("triton", "cuda", "external")
#: Runtime modes, plus ``build`` (binary evidence, no device needed): see :mod:`opgate.matrix.modes`.
MODES: tuple[str, ...] = MODE_NAMES
#: Generated layouts (validators derive the strides from the op's sample inputs).
LAYOUTS: tuple[str, ...] = (
    "contiguous",
    "transposed",
    "strided",
    "offset",
    "broadcast",
    "misaligned",
    "zero_size",
)
#: Axis value used when an axis does not apply to a cell (cpu has no cuda; build has no dtype).
NOT_APPLICABLE = {"cuda": "none", "dtype": "all", "layout": "all"}
DEFAULT_SHAPES = "default"


def torch_major_minor(version: str) -> str:
    """``"2.13.0+cpu"`` -> ``"2.13"``; anything unparsable is returned unchanged."""
    parts = version.split("+", 1)[0].split(".")
    return ".".join(parts[:2]) if len(parts) >= 2 else version


@dataclass(frozen=True, order=True)
class Cell:
    """One immutable cell.  ``overrides`` carries per-slice settings (e.g. a tolerance)."""

    op: str
    impl: str
    torch: str
    cuda: str
    arch: str
    dtype: str
    layout: str
    mode: str
    shapes: str = DEFAULT_SHAPES
    overrides: tuple[tuple[str, Any], ...] = field(default=(), compare=False)

    @property
    def id(self) -> str:
        env = f"pt{torch_major_minor(self.torch)}"
        device = self.arch if self.arch == "cpu" else f"cu{self.cuda}-{self.arch}"
        parts = [f"{self.op}.{self.impl}", env, device, self.dtype, self.layout, self.mode]
        if self.shapes != DEFAULT_SHAPES:
            parts.append(self.shapes)
        return "-".join(parts)

    @property
    def is_gpu(self) -> bool:
        return self.arch != "cpu"

    def axes(self) -> dict[str, str]:
        """Axis values by name, in id order (what results and reports record)."""
        return {name: getattr(self, name) for name in AXES}

    def override(self, key: str, default: Any = None) -> Any:
        for k, v in self.overrides:
            if k == key:
                return v
        return default

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, **self.axes(), "overrides": dict(self.overrides)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Cell:
        values = {name: str(data[name]) for name in AXES}
        overrides = tuple(sorted(dict(data.get("overrides") or {}).items()))
        return cls(**values, overrides=overrides)


def matches(cell_id: str, patterns: Iterable[str]) -> bool:
    """True if ``cell_id`` matches any glob (``fnmatchcase``: ids are case-sensitive)."""
    return any(fnmatch.fnmatchcase(cell_id, p) for p in patterns)


def select(cells: Iterable[Cell], select: Iterable[str] = (), skip: Iterable[str] = ()) -> list[Cell]:
    """Keep cells matching any ``select`` glob (all when none given) and no ``skip`` glob."""
    sel, sk = list(select), list(skip)
    return [c for c in cells if (not sel or matches(c.id, sel)) and not matches(c.id, sk)]
