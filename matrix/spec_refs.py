"""``module:attribute`` references of a spec, checked without importing anything.

A typo in ``entry: my_ops.rms_norm.triton_impl:rms_nrom`` used to surface
minutes later as an ``error`` in every cell of the op (each worker failed to
import it) and exit 1.  It is a spec error: exit 3 with ``file:line`` before
any cell runs.  Importing the module to find out is not an option, because
``opgate list`` must never import torch (nor the op), so the reference is
resolved *statically*:

* the module file is located the way the import system would find it, from
  the spec's import root, opgate's own folder (``opgate.*``) and the installed
  packages (``importlib.util.find_spec`` of the top-level name only, which runs
  the finders but executes no package code);
* the attribute must be bound at the top level of that file (``def``,
  ``class``, an assignment, an import), found with :mod:`ast`.

Whatever cannot be decided statically is accepted, never refused: an extension
module, a module-level ``__getattr__``, a ``from x import *``, a package that
cannot be walked.  A module of a distribution the implementation ``requires``
may be absent (its cells are ``skip`` then), so it is not an error either.
"""

from __future__ import annotations

import ast
import difflib
import functools
import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opgate.matrix.schema import Problems, valid
from opgate.matrix.yamlload import YMap, YNode

#: The folder holding opgate's stages: the checkout's root, or ``site-packages/opgate``.
OPGATE_DIR = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Found:
    """A module located on disk; ``path`` is None where it exists but holds no Python source."""

    path: Path | None
    #: folders of its submodules (a package), empty for a plain module
    search: tuple[Path, ...] = ()


def _child(name: str, folders: Sequence[Path]) -> Found | None:
    """Submodule ``name`` in one of ``folders``, as the path-based finder looks for it."""
    for folder in folders:
        package = folder / name
        if (package / "__init__.py").is_file():
            return Found(package / "__init__.py", (package,))
        if (folder / f"{name}.py").is_file():
            return Found(folder / f"{name}.py")
        if any(folder.glob(f"{name}.*.so")) or any(folder.glob(f"{name}.*.pyd")):
            return Found(None)
    namespace = tuple(f / name for f in folders if (f / name).is_dir())
    return Found(None, namespace) if namespace else None


def _top_level(name: str, roots: Sequence[Path]) -> Found | None:
    if name == "opgate":
        return Found(None, (OPGATE_DIR,))
    local = _child(name, roots)
    if local is not None:
        return local
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    origin = Path(spec.origin) if spec.origin and spec.origin.endswith(".py") else None
    return Found(origin, tuple(Path(p) for p in spec.submodule_search_locations or ()))


def locate(module: str, roots: Sequence[Path]) -> tuple[Found | None, str]:
    """(where ``module`` is, "") or (None, the part that is missing, with a did-you-mean)."""
    parts = module.split(".")
    found = _top_level(parts[0], roots)
    if found is None:
        return None, f"no module {parts[0]!r} (not under {_roots(roots)} and not installed)"
    for depth, part in enumerate(parts[1:], start=1):
        if not found.search:
            if found.path is None:  # an extension or builtin module: cannot look inside
                return Found(None), ""
            return None, f"{'.'.join(parts[:depth])} is a module, not a package: no {part!r} inside it"
        child = _child(part, found.search)
        if child is None:
            return None, f"no module {'.'.join(parts[: depth + 1])!r}" + _hint(part, _siblings(found.search))
        found = child
    return found, ""


def _roots(roots: Sequence[Path]) -> str:
    return ", ".join(str(r) for r in roots) or "the spec's folder"


def _siblings(folders: Sequence[Path]) -> list[str]:
    names = []
    for folder in folders:
        for entry in folder.iterdir():
            if entry.suffix == ".py" and entry.stem != "__init__":
                names.append(entry.stem)
            elif (entry / "__init__.py").is_file():
                names.append(entry.name)
    return names


def _hint(name: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


@functools.lru_cache(maxsize=256)
def bound_names(path: Path) -> frozenset[str] | None:
    """Names bound at the top level of a Python file; None where that cannot be known statically."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return None  # a broken file is the worker's error to report, with its traceback
    names: set[str] = set()
    todo: list[ast.AST] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            continue  # what a body binds is local to it
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    return None
                names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        # names bound under a top-level if/try/with/for count as well (import fallbacks)
        for field in ("body", "orelse", "finalbody", "handlers"):
            todo.extend(getattr(node, field, []))
    if "__getattr__" in names:
        return None
    return frozenset(names)


def check_reference(ref: str, roots: Sequence[Path], *, optional: bool = False) -> str | None:
    """Why ``module`` or ``module:attr`` cannot resolve, or None (resolves, or cannot be decided).

    ``optional``: the module belongs to a distribution the implementation
    ``requires``, which may be absent here (its cells skip): only a module that
    *is* found is checked further.
    """
    module, _, attr = ref.partition(":")
    found, problem = locate(module, roots)
    if found is None:
        if optional and module.split(".")[0] != "opgate" and _top_level(module.split(".")[0], roots) is None:
            return None
        return f"{ref!r}: {problem}"
    if not attr or found.path is None:
        return None
    first = attr.split(".")[0]
    names = bound_names(found.path)
    if names is None or first in names:
        return None
    if found.search and _child(first, found.search) is not None:
        return None  # a submodule, which an import of it binds
    public = sorted(n for n in names if not n.startswith("__"))
    return f"{ref!r}: {module} ({found.path}) defines no {first!r}" + _hint(first, public)


def import_root(directory: Path) -> Path:
    """The folder an ``--ops-path DIR``'s references import from.

    ``DIR`` itself, unless it is a package (holds ``__init__.py``): then the
    first folder above it that is not one, as pytest finds a test's rootdir.
    So a team's ``ops/`` package (``ops/my_op/spec.yaml`` naming
    ``ops.my_op.reference:my_op``) validates with ``--ops-path ops``.
    """
    root = directory.resolve()
    while (root / "__init__.py").is_file() and root.parent != root:
        root = root.parent
    return root


def search_roots(root: Path | None) -> list[Path]:
    """Where a spec's references are looked up before the installed packages.

    Its import root, then the working directory: workers start as ``python -m``,
    which puts the working directory first on ``sys.path``.
    """
    return [*([root] if root is not None else []), Path.cwd()]


def reference_problems(data: dict[str, Any], tree: YMap, root: Path | None, problems: Problems) -> None:
    """Add a problem, at the key's line, for every reference of the spec that does not resolve."""
    roots = search_roots(root)

    def check(key: str, node: YNode | None, ref: Any, optional: bool = False) -> None:
        if node is not None and isinstance(ref, str) and valid(ref):
            problem = check_reference(ref, roots, optional=optional)
            if problem:
                problems.add(node.where, f"{key}: {problem}")

    for key in ("reference", "samples"):
        check(key, tree.get(key), data.get(key))
    impls, nodes = data.get("implementations"), tree.get("implementations")
    if not (isinstance(impls, dict) and isinstance(nodes, YMap)):
        return
    for name, raw in impls.items():
        node = nodes.get(name)
        if isinstance(raw, dict) and isinstance(node, YMap):
            optional = bool(raw.get("requires"))  # a distribution that may be absent: its cells skip
            for key in ("module", "entry"):
                check(f"implementations.{name}.{key}", node.get(key), raw.get(key), optional)
