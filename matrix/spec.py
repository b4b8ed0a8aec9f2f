"""Op specs (``ops/SPEC.md``): discovery, validation and the typed view validators use.

A spec is data: this module never imports an op (nor torch), so ``python -m
matrix list`` stays fast on a machine without a GPU stack.  Callables named
``module:attribute`` are imported later, inside a validator worker, by
:func:`resolve`.  Specs are checked with the same schema machinery as the
matrix config, so every mistake is reported as ``file:line`` with a hint.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import importlib
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opgate.matrix import cost
from opgate.matrix.errors import ConfigError, ConfigErrors, Location, UsageError
from opgate.matrix.files import MAX_YAML_BYTES, read_bytes
from opgate.matrix.schema import (
    Problems,
    valid,
    validate,
)
from opgate.matrix.spec_evidence import evidence_checks
from opgate.matrix.spec_refs import import_root, reference_problems
from opgate.matrix.spec_schema import (
    CONTROL_IMPL,
    DEVICE_KINDS,
    OPS_DIR,
    REF_HINT,
    REF_PATTERN,
    SPEC_SCHEMA,
)
from opgate.matrix.yamlload import YMap, YNode, load_yaml


@dataclass(frozen=True)
class Tolerance:
    """In output-dtype ulps: op error <= ``k`` x the reference's + a fixed slack (validators.tolerance)."""

    k: float
    atol_floor: float


@dataclass(frozen=True)
class Mutates:
    """Declared writes: input positions (forward) and grad_output positions (backward)."""

    inputs: tuple[int, ...] = ()
    grad_outputs: tuple[int, ...] = ()


@dataclass(frozen=True)
class Evidence:
    """Glob patterns over profiler event / kernel names: one must match ``expect``, none ``forbid``."""

    expect: tuple[str, ...] = ()
    forbid: tuple[str, ...] = ()


@dataclass(frozen=True)
class Unsupported:
    match: str
    reason: str


@dataclass(frozen=True)
class Library:
    """A C++ library an implementation's module builds at import (e.g. a C++ launch path).

    Declared so the run can build it once, early, on a build lane (the
    implementation's ``build`` cells), instead of in the first GPU cell of every
    worker at once: on the H200 five GPU lanes each waited 23 s for the one that
    built it.  Built for the implementation's ``arch_policy``, the key its module
    asks the builder for.
    """

    name: str
    sources: tuple[Path, ...]


@dataclass(frozen=True)
class ImplSpec:
    """One implementation; dtypes/layouts/modes/tolerance are already resolved against the op."""

    name: str
    kind: str
    module: str
    entry: str
    qualname: str | None
    evidence: dict[str, Evidence]
    sources: list[Path]
    arch_policy: dict[str, Any]
    requires: list[str]
    dtypes: list[str]
    layouts: list[str]
    modes: list[str]
    unsupported: list[Unsupported]
    tolerance: Tolerance
    copies_allowed: int
    mode_evidence: dict[str, dict[str, Evidence]]
    #: an external implementation's binaries (``files``, ``distribution``, ``loaded``, ``triton``)
    binaries: dict[str, Any] = dataclasses.field(default_factory=dict)
    mutates: Mutates = Mutates()
    #: C++ libraries the module builds through opgate's builder when it is imported on a GPU
    #: (:class:`Library`): its build cells start them, its GPU cells wait for those cells
    libraries: tuple[Library, ...] = ()

    @property
    def sass(self) -> list[str]:
        """The arches whose SASS the binaries must hold (``arch_policy.sass``; [] when unsaid)."""
        return list(self.arch_policy.get("sass") or [])

    @property
    def ptx(self) -> bool:
        """Whether the binaries must hold PTX of each claimed arch too (``arch_policy.ptx``)."""
        return bool(self.arch_policy.get("ptx", False))

    @property
    def audits_binaries(self) -> bool:
        """An external implementation whose spec names binaries has ``build`` cells."""
        b = self.binaries
        return bool(b.get("files") or b.get("loaded") or b.get("triton"))

    def evidence_for(self, device_kind: str, mode: str) -> Evidence:
        """Evidence for a device kind in a mode: a mode's own rule, field by field over the default."""
        if device_kind not in DEVICE_KINDS:
            raise ValueError(f"device_kind must be one of {DEVICE_KINDS}, got {device_kind!r}")
        specific = self.mode_evidence.get(mode, {}).get(device_kind)
        return specific if specific is not None else self.evidence.get(device_kind, Evidence())

    def unsupported_reason(self, cell_id: str) -> str | None:
        """Why the spec declares this cell unsupported, or None (first matching glob wins)."""
        return next((u.reason for u in self.unsupported if fnmatch.fnmatchcase(cell_id, u.match)), None)


@dataclass(frozen=True)
class OpSpec:
    op: str
    summary: str
    #: inventory group (``norm``, ``activation``, ...): ``ops/SPEC.md``
    category: str
    reference: str
    samples: str
    shapes: dict[str, list[tuple[int, ...]]]
    cost: dict[str, Any]  # bytes, flops (+ backward_*): expressions; symbols: list of names
    dtypes: list[str]
    layouts: list[str]
    modes: list[str]
    dynamic_shapes: bool
    tolerance: Tolerance
    copies_allowed: int
    implementations: dict[str, ImplSpec]
    path: Path
    #: the folder its references import from (see ``discover``); None for opgate's own
    root: Path | None
    #: several PyTorch ops computed in one kernel (op inventory); declared by the spec
    fused: bool = False
    #: globs, relative to the spec, of files the op's code reads at run time: they count for its
    #: verdict-cache digest and ``--changed-since`` as its imported sources do
    data: tuple[str, ...] = ()


def resolve(ref: str, root: Path | None = None) -> Any:
    """Import ``"pkg.mod:attr"`` (``root`` is put on ``sys.path`` first, for --ops-path specs)."""
    if not re.fullmatch(REF_PATTERN, ref):
        raise ConfigError(f"bad reference {ref!r}", hint=REF_HINT)
    if root is not None and str(root) not in sys.path:
        sys.path.insert(0, str(root))
    module_name, attr = ref.split(":", 1)
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import {module_name!r} for {ref!r}: {exc}") from exc
    missing = object()
    for part in attr.split("."):
        obj = getattr(obj, part, missing)
        if obj is missing:
            raise ConfigError(f"{ref!r}: {module_name} has no attribute {attr!r}")
    return obj


def _rule(raw: dict[str, Any] | None, base: Evidence | None = None) -> Evidence:
    base = base or Evidence()
    raw = raw or {}
    return Evidence(
        expect=tuple(raw.get("expect", base.expect)), forbid=tuple(raw.get("forbid", base.forbid))
    )


def _requires(raw: dict[str, Any]) -> list[str]:
    """The implementation's ``requires``; a Triton kernel also needs ``triton``.

    A CPU build of torch does not pull Triton in, so without it a Triton op's
    cells are ``skip`` ("requires triton"), not an ``error`` per cell.
    """
    requires = list(raw.get("requires", []))
    if raw.get("kind") == "triton" and "triton" not in requires:
        requires.append("triton")
    return requires


def _impl(name: str, raw: dict[str, Any], op: dict[str, Any], spec_dir: Path) -> ImplSpec:
    ev = raw["evidence"]
    default = {dk: _rule(ev[dk]) for dk in DEVICE_KINDS if dk in ev}
    modes = {m: {dk: _rule(r[dk], default.get(dk)) for dk in r} for m, r in ev.get("modes", {}).items()}
    tol = {**op["tolerance"], **raw.get("tolerance", {})}
    return ImplSpec(
        name=name,
        kind=raw["kind"],
        module=raw.get("module") or raw["entry"].split(":", 1)[0],
        entry=raw["entry"],
        qualname=raw.get("qualname"),
        evidence=default,
        sources=[spec_dir / s for s in raw.get("sources", [])],
        arch_policy=dict(raw.get("arch_policy", {})),
        requires=_requires(raw),
        dtypes=list(raw.get("dtypes", op["dtypes"])),
        layouts=list(raw.get("layouts", op["layouts"])),
        modes=list(raw.get("modes", op["modes"])),
        unsupported=[Unsupported(u["match"], u["reason"]) for u in raw.get("unsupported", [])],
        tolerance=Tolerance(k=tol["k"], atol_floor=tol["atol_floor"]),
        copies_allowed=int(raw.get("copies_allowed", op.get("copies_allowed", 0))),
        mode_evidence=modes,
        binaries=_binaries(raw),
        libraries=tuple(
            Library(str(lib["name"]), tuple(spec_dir / s for s in lib["sources"]))
            for lib in raw.get("libraries", [])
        ),
        mutates=Mutates(
            inputs=tuple(raw.get("mutates", {}).get("inputs", ())),
            grad_outputs=tuple(raw.get("mutates", {}).get("grad_outputs", ())),
        ),
    )


def _binaries(raw: dict[str, Any]) -> dict[str, Any]:
    """The ``binaries`` key with its default: files belong to the first required distribution."""
    found = dict(raw.get("binaries") or {})
    if found.get("files") and "distribution" not in found and raw.get("requires"):
        found["distribution"] = raw["requires"][0]
    return found


def _impl_checks(
    name: str, raw: dict[str, Any], op: dict[str, Any], node: YNode, *, spec_dir: Path, problems: Problems
) -> None:
    """Cross-field checks of one implementation (only on parts that validated)."""
    where = node.where

    def line(key: str) -> Location:
        found = node.key(key) if isinstance(node, YMap) else None
        return found.where if found is not None else where

    kind = raw.get("kind")
    if kind in ("triton", "cuda"):
        for key, hint in (("module", "the module that registers the op"), ("qualname", "e.g. opgate::my_op")):
            if key not in raw:
                problems.add(where, f"implementations.{name}: kind {kind} needs {key}", hint)
    if kind == "cuda" and "sources" not in raw:
        problems.add(where, f"implementations.{name}: kind cuda needs sources", "list the .cu/.cpp files")
    sources = raw.get("sources")
    for src in sources if isinstance(sources, list) and valid(sources) else []:
        if not (spec_dir / src).is_file():
            problems.add(
                line("sources"), f"implementations.{name}.sources: {src!r} not found next to the spec"
            )
    _libraries_checks(name, raw, line, spec_dir, problems)
    for axis in ("dtypes", "layouts", "modes"):
        claimed, allowed = raw.get(axis), op.get(axis)
        if isinstance(claimed, list) and isinstance(allowed, list) and valid(claimed) and valid(allowed):
            extra = [v for v in claimed if v not in allowed]
            if extra:
                problems.add(
                    line(axis),
                    f"implementations.{name}.{axis}: {', '.join(extra)} not claimed by the op",
                    f"an implementation narrows the op's {axis}; add them to the op-level list",
                )
    _binaries_checks(name, raw, line, problems)
    ev = raw.get("evidence")
    if valid(ev) and isinstance(ev, dict):
        evidence_checks(name, raw, op, ev, where=line("evidence"), problems=problems)


def _libraries_checks(name: str, raw: dict[str, Any], line: Any, spec_dir: Path, problems: Problems) -> None:
    """``libraries``: kinds that build with opgate's builder, sources that exist, one name each."""
    libraries = raw.get("libraries")
    if not (isinstance(libraries, list) and valid(libraries)):
        return
    kind = raw.get("kind")
    if kind not in ("triton", "cuda"):
        problems.add(
            line("libraries"),
            f"implementations.{name}.libraries: kind {kind} builds nothing with opgate",
            "libraries are for triton and cuda implementations whose module builds C++ at import",
        )
    seen: set[str] = set()
    for lib in libraries:
        if not isinstance(lib, dict):
            continue
        if lib.get("name") in seen:
            problems.add(line("libraries"), f"implementations.{name}.libraries: {lib['name']!r} twice")
        seen.add(str(lib.get("name")))
        for src in lib.get("sources") or []:
            if isinstance(src, str) and not (spec_dir / src).is_file():
                problems.add(
                    line("libraries"),
                    f"implementations.{name}.libraries.{lib.get('name')}: {src!r} not found next to the spec",
                )


def _binaries_checks(name: str, raw: dict[str, Any], line: Any, problems: Problems) -> None:
    """``binaries`` belongs to external implementations, and an external ``build`` needs it."""
    kind, binaries = raw.get("kind"), raw.get("binaries")
    names = isinstance(binaries, dict) and any(binaries.get(k) for k in ("files", "loaded", "triton"))
    if binaries is not None and kind != "external" and valid(binaries):
        problems.add(
            line("binaries"),
            f"implementations.{name}.binaries: only kind external names its binaries",
            "kind cuda builds its sources and kind triton cross-compiles its kernels for build cells",
        )
    modes = raw.get("modes")
    if kind == "external" and isinstance(modes, list) and "build" in modes and not names:
        problems.add(
            line("modes"),
            f"implementations.{name}.modes: build of an external implementation needs binaries",
            "name them: binaries: {files: ['pkg/lib*.so']}, {loaded: true} or {triton: true}",
        )
    if (
        isinstance(binaries, dict)
        and binaries.get("files")
        and not (binaries.get("distribution") or raw.get("requires"))
    ):
        problems.add(
            line("binaries"),
            f"implementations.{name}.binaries: files need a distribution to be relative to",
            "add distribution: NAME, or list it under requires",
        )


def _cost_checks(data: dict[str, Any], tree: YMap, problems: Problems) -> None:
    """Every cost expression evaluates on every declared shape (:func:`opgate.matrix.cost.problems`)."""
    raw_cost, shapes, node = data.get("cost"), data.get("shapes"), tree.get("cost")
    if not (isinstance(raw_cost, dict) and valid(raw_cost) and isinstance(shapes, dict) and valid(shapes)):
        return
    every_shape = [tuple(s) for sets in shapes.values() for s in sets]
    for key, why in cost.problems(raw_cost, every_shape):
        found = node.key(key) if isinstance(node, YMap) else None
        where = found.where if found is not None else (node.where if node is not None else tree.where)
        hint = "name the shape's dimensions with cost.symbols" if "symbol" in why else None
        problems.add(where, f"cost.{key}: {why}", hint)


def _data_checks(data: dict[str, Any], tree: YMap, spec_dir: Path, problems: Problems) -> None:
    """Each ``data`` glob matches a file: one that matches nothing is a typo, and would count for nothing."""
    from opgate.matrix.sources import data_files

    globs, node = data.get("data"), tree.get("data")
    if not (isinstance(globs, list) and valid(globs)) or node is None:
        return
    for pattern in globs:
        if isinstance(pattern, str) and not data_files(spec_dir, [pattern]):
            problems.add(
                node.where,
                f"data: {pattern!r} matches no file next to the spec",
                "a glob relative to the spec's folder, e.g. tables/*.json",
            )


def load_spec(path: Path, root: Path | None) -> OpSpec:
    """Validate one spec file; ``root`` is the directory its module references import from."""
    path = Path(path)
    tree = load_yaml(path, defer_words=True)  # YAML 1.1 booleans are judged where they stand
    problems = Problems()
    data = validate(SPEC_SCHEMA, tree, problems)
    if isinstance(data, dict) and isinstance(tree, YMap):
        shapes = data.get("shapes")
        shapes_key = tree.key("shapes")
        if isinstance(shapes, dict) and "default" not in shapes and shapes_key is not None:
            problems.add(shapes_key.where, "shapes: a 'default' shape set is required")
        _cost_checks(data, tree, problems)
        _data_checks(data, tree, path.parent, problems)
        impls, impl_nodes = data.get("implementations"), tree.get("implementations")
        if isinstance(impls, dict) and isinstance(impl_nodes, YMap):
            for name, raw in impls.items():
                node = impl_nodes.get(name)
                if name == CONTROL_IMPL and node is not None:
                    problems.add(
                        node.where,
                        f"implementations.{name}: the name is reserved for opgate's environment controls",
                        "rename the implementation",
                    )
                if isinstance(raw, dict) and node is not None:
                    _impl_checks(name, raw, data, node, spec_dir=path.parent, problems=problems)
        reference_problems(data, tree, root, problems)
    problems.raise_if_any()
    impls = {n: _impl(n, raw, data, path.parent) for n, raw in data["implementations"].items()}
    return OpSpec(
        op=data["op"],
        summary=data["summary"],
        category=data["category"],
        reference=data["reference"],
        samples=data["samples"],
        shapes={k: [tuple(s) for s in v] for k, v in data["shapes"].items()},
        cost=dict(data.get("cost", {})),
        dtypes=list(data["dtypes"]),
        layouts=list(data["layouts"]),
        modes=list(data["modes"]),
        dynamic_shapes=bool(data.get("dynamic_shapes", False)),
        fused=bool(data.get("fused", False)),
        data=tuple(data.get("data", ())),
        tolerance=Tolerance(**data["tolerance"]),
        copies_allowed=int(data.get("copies_allowed", 0)),
        implementations=impls,
        path=path,
        root=root,
    )


_HOLDS_SPEC = re.compile(r"^[\"']?spec_version[\"']?\s*:", re.MULTILINE)


def discover(extra_paths: Sequence[Path] = ()) -> list[tuple[Path, Path | None]]:
    """(spec file, import root): opgate's own specs, then per DIR ``*/spec.yaml`` and ``*.yaml`` specs.

    opgate's own ops import as ``opgate.ops.*`` and get no import root: their
    folder is never put on ``sys.path``, so a user package named ``ops`` (or
    ``matrix``...) is never shadowed by opgate's.  An ``--ops-path`` DIR is its
    specs' import root, or the folder above it when DIR is a package
    (:func:`matrix.spec_refs.import_root`).
    """
    found: list[tuple[Path, Path | None]] = [(p, None) for p in sorted(OPS_DIR.glob("*/spec.yaml"))]
    for raw_dir in extra_paths:
        directory = Path(raw_dir).resolve()
        if not directory.is_dir():
            raise UsageError(f"--ops-path {raw_dir}: not a directory")
        root = import_root(directory)
        found += [(p, root) for p in sorted(directory.glob("*/spec.yaml"))]
        for p in sorted(directory.glob("*.yaml")):
            head = read_bytes(p, what="a YAML file", limit=MAX_YAML_BYTES * 4, error=ConfigError)
            if _HOLDS_SPEC.search(head.decode("utf-8", errors="replace")):
                found.append((p, root))
    return found


def load_specs(extra_paths: Sequence[Path] = ()) -> dict[str, OpSpec]:
    """Every discoverable spec by op name; an op defined twice is an error naming both files."""
    specs: dict[str, OpSpec] = {}
    errors: list[ConfigError] = []
    seen_files: set[Path] = set()
    for path, root in discover(extra_paths):
        if path.resolve() in seen_files:
            continue  # the same folder given twice (or ops/ given as --ops-path)
        seen_files.add(path.resolve())
        try:
            spec = load_spec(path, root)
        except ConfigError as exc:
            errors.extend(getattr(exc, "errors", [exc]))
            continue
        if spec.op in specs:
            first = specs[spec.op]
            errors.append(
                ConfigError(
                    f"op {spec.op!r} is defined twice: {first.path} and {path}",
                    _op_line(path),
                    f"first defined at {_op_line(first.path)}; rename one or drop an --ops-path",
                )
            )
            continue
        specs[spec.op] = spec
    if errors:
        raise ConfigErrors(errors)
    return specs


def _op_line(path: Path) -> Location:
    tree = load_yaml(path)
    key = tree.key("op") if isinstance(tree, YMap) else None
    return key.where if key is not None else Location(str(path), 1)
