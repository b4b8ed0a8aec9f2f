"""The matrix config (``matrix/default.yaml`` format), validated before any work.

The config says which axes to span; op specs say what each op claims;
:func:`matrix.expand.expand` intersects the two.  Everything here is checked
up front, with ``file:line`` and a did-you-mean, so a typo never silently
shrinks the matrix.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from opgate.matrix.cell import ARCHES, DTYPES, LAYOUTS, MODES
from opgate.matrix.errors import Location
from opgate.matrix.schema import (
    Enum,
    Field,
    Float,
    Glob,
    Int,
    ListOf,
    MapOf,
    Problems,
    Record,
    Str,
    valid,
    validate,
)
from opgate.matrix.yamlload import YMap, YNode, YSeq, load_yaml

MATRIX_VERSION = 1
DEFAULT_CONFIG = Path(__file__).with_name("default.yaml")
#: ``installed`` = the torch of the interpreter that expands the matrix.
INSTALLED = "installed"
NAME_PATTERN = r"[a-z][a-z0-9_]*"
#: A torch release as opgate names its cells' torch column (2.13, 2.13.0, 2.14.1+cu130, 2.15.0a0).
TORCH_VERSION = r"\d+\.\d+(\.\d+)?([a-z0-9.+]*)"
_TORCH = Str("a torch version", rf"installed|{TORCH_VERSION}", 'e.g. "2.13.0" or installed')
_CUDA = Str("a CUDA version", r"\d+\.\d+", 'e.g. "13.0" (quoted: 13.10 would read as 13.1)')

TOLERANCE_FIELDS = {"k": Float(0.0, strict=True), "atol_floor": Float(0.0)}
OVERRIDE_SETTINGS = {
    "tolerance": Record("tolerance", TOLERANCE_FIELDS),
    "copies_allowed": Int(minimum=0),
    "timeout_s": Float(0.0, strict=True),
    "memory_mb": Int(minimum=64),
}
CONFIG_SCHEMA = Record(
    "matrix config",
    {
        "matrix_version": Field(Int(choices=(MATRIX_VERSION,)), required=True),
        "ops": Field(ListOf(Glob("an op glob"), min_len=1), required=True),
        "implementations": Field(ListOf(Glob("an implementation glob"), min_len=1), required=True),
        "torch": Field(ListOf(_TORCH, min_len=1, unique=True), required=True),
        "cuda": ListOf(_CUDA, unique=True),
        "build_cuda": ListOf(_CUDA, unique=True),
        "arch": Field(ListOf(Enum(ARCHES, "arch"), min_len=1, unique=True), required=True),
        "dtype": Field(ListOf(Enum(DTYPES, "dtype"), min_len=1, unique=True), required=True),
        "layout": Field(ListOf(Enum(LAYOUTS, "layout"), min_len=1, unique=True), required=True),
        "mode": Field(ListOf(Enum(MODES, "mode"), min_len=1, unique=True), required=True),
        "shapes": ListOf(Str("a shape set name", NAME_PATTERN), min_len=1, unique=True),
        "select": ListOf(Glob()),
        "skip": ListOf(Glob()),
        "overrides": ListOf(
            Record("override", {"select": Field(Glob(), required=True), **OVERRIDE_SETTINGS})
        ),
        "runners": MapOf(Enum(ARCHES, "arch"), ListOf(Str("a runner label", r"[A-Za-z0-9_.-]+"), min_len=1)),
    },
)


@dataclass(frozen=True)
class Override:
    """Settings for the cells whose id matches ``select``; later overrides win per key."""

    select: str
    settings: tuple[tuple[str, Any], ...]
    where: Location

    def get(self, key: str) -> Any:
        return dict(self.settings).get(key)


@dataclass(frozen=True)
class MatrixConfig:
    """A validated matrix config.  ``locations`` maps ``"shapes"``, ``"shapes[1]"``, ... to lines."""

    path: Path
    version: int
    ops: tuple[str, ...]
    implementations: tuple[str, ...]
    torch: tuple[str, ...]
    cuda: tuple[str, ...]
    #: extra nvcc versions for ``build`` cells only (no runtime column: torch fixes the runtime CUDA)
    build_cuda: tuple[str, ...]
    arch: tuple[str, ...]
    dtype: tuple[str, ...]
    layout: tuple[str, ...]
    mode: tuple[str, ...]
    shapes: tuple[str, ...] = ("default",)
    select: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()
    overrides: tuple[Override, ...] = ()
    runners: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))
    locations: Mapping[str, Location] = field(default_factory=lambda: MappingProxyType({}), compare=False)

    def where(self, key: str) -> Location:
        """Line of ``key`` (``"torch"``, ``"torch[0]"``, ...), falling back to the top of the file."""
        top = key.split("[", maxsplit=1)[0]
        return self.locations.get(key) or self.locations.get(top) or Location(str(self.path), 1)


def _locations(tree: YNode) -> dict[str, Location]:
    out: dict[str, Location] = {}
    if not isinstance(tree, YMap):
        return out
    for key, value in tree:
        out[str(key.value)] = key.where
        if isinstance(value, YSeq):
            for i, item in enumerate(value.items):
                out[f"{key.value}[{i}]"] = item.where
        elif isinstance(value, YMap):
            for sub, _ in value:
                out[f"{key.value}.{sub.value}"] = sub.where
    return out


def _cross_checks(data: dict[str, Any], tree: YNode, problems: Problems) -> None:
    """Checks that span keys: GPU arches need a cuda version; an override must set something."""
    locs = _locations(tree)
    arches = data.get("arch")
    if (
        isinstance(arches, list)
        and valid(arches)
        and any(a != "cpu" for a in arches)
        and not data.get("cuda")
    ):
        problems.add(locs.get("arch"), "GPU arches need at least one cuda version", 'add cuda: ["13.0"]')
    overrides = data.get("overrides") or []
    if valid(overrides):
        for i, ov in enumerate(overrides):
            if not set(ov) & set(OVERRIDE_SETTINGS):
                hint = f"set one of: {', '.join(OVERRIDE_SETTINGS)}"
                problems.add(locs.get(f"overrides[{i}]"), f"overrides[{i}]: sets nothing", hint)


def load_config(path: Path | None = None) -> MatrixConfig:
    """Read and validate a matrix config (default: ``matrix/default.yaml``); raises ConfigErrors."""
    path = Path(path) if path is not None else DEFAULT_CONFIG
    tree = load_yaml(path)
    problems = Problems()
    data = validate(CONFIG_SCHEMA, tree, problems)
    if isinstance(data, dict):
        _cross_checks(data, tree, problems)
    problems.raise_if_any()
    locs = _locations(tree)
    overrides = tuple(
        Override(
            select=ov["select"],
            settings=tuple(sorted((k, v) for k, v in ov.items() if k != "select")),
            where=locs[f"overrides[{i}]"],
        )
        for i, ov in enumerate(data.get("overrides", []))
    )
    runners = {arch: tuple(labels) for arch, labels in data.get("runners", {}).items()}

    def axis(key: str, default: tuple[str, ...] = ()) -> tuple[str, ...]:
        return tuple(data[key]) if key in data else default

    return MatrixConfig(
        path=path,
        version=data["matrix_version"],
        ops=axis("ops"),
        implementations=axis("implementations"),
        torch=axis("torch"),
        cuda=axis("cuda"),
        build_cuda=axis("build_cuda"),
        arch=axis("arch"),
        dtype=axis("dtype"),
        layout=axis("layout"),
        mode=axis("mode"),
        shapes=axis("shapes", ("default",)),
        select=axis("select"),
        skip=axis("skip"),
        overrides=overrides,
        runners=MappingProxyType(runners),
        locations=MappingProxyType(locs),
    )
