"""The files a verdict depends on: an op's sources (followed through its imports), and the harness.

Two questions need the same answer.  The verdict cache
(:mod:`opgate.validators.cache`) asks "did anything this cell depends on
change?" and digests the files; ``--changed-since REF``
(:mod:`opgate.matrix.changes`) asks "which ops can a git diff affect?" and
compares paths.  Both walk the same imports, so a shared helper
(``ops/_triton_util.py``) or a sibling op's kernels that ``fused_add_rms_norm``
imports count for the ops that import them, and a self-test script nothing
imports counts for none.  Files an op reads at run time (a table, a config)
are no import: the spec names them (``data``, globs relative to it), and they
count the same way, a file added or deleted under a glob too.  It lives in
the matrix stage because ``opgate plan`` answers the second question without
importing the validators (or torch).

Third-party modules are never walked: they are covered by their installed
versions in the cache's environment key.
"""

from __future__ import annotations

import ast
import fnmatch
import functools
import importlib.util
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SOURCE_SUFFIXES = frozenset(
    {".py", ".yaml", ".yml", ".cu", ".cuh", ".cpp", ".cc", ".c", ".h", ".hpp", ".inl"}
)
#: What a CUDA C++ implementation's folder contributes (its .py files count only if imported).
CUDA_SUFFIXES = frozenset({".cu", ".cuh", ".cpp", ".cc", ".c", ".h", ".hpp", ".inl"})
#: The folder holding opgate's stages (``matrix``, ``validators``, ``ops``, ``reports``): the
#: checkout's root, or ``site-packages/opgate`` once installed.
OPGATE_DIR = Path(__file__).resolve().parent.parent
#: Headers shared by every opgate CUDA op (on each build's include path).
SHARED_CUDA = OPGATE_DIR / "ops" / "_cuda"
#: The stages whose code judges every cell: a change to them (or to the opgate modules they
#: import, such as the spec loader) can change any verdict.
HARNESS_PACKAGES = ("validators", "matrix")


def source_files(
    folder: Path, recursive: bool, suffixes: frozenset[str] = frozenset({".py"})
) -> Iterable[Path]:
    """Source files of ``folder`` (all of them when recursive, else those with ``suffixes``)."""
    if not folder.is_dir():
        return
    pattern = folder.rglob("*") if recursive else (p for p in folder.iterdir() if p.suffix in suffixes)
    for path in sorted(pattern):
        rel = path.relative_to(folder).parts
        if (
            path.is_file()
            and path.suffix in SOURCE_SUFFIXES
            and not any(p.startswith(".") or p in ("__pycache__", "build") for p in rel)
        ):
            yield path


def module_candidates(name: str, roots: Sequence[Path]) -> list[Path]:
    """Every file module ``name`` could be: opgate's own (``opgate.<stage>...``) or under ``roots``.

    Listed whether or not they exist, so a deleted module an op still imports
    is still one of the op's paths.  Empty for third-party modules.
    """
    parts = name.split(".")
    if parts[0] == "opgate":
        roots, parts = [OPGATE_DIR], parts[1:]
        if not parts:
            return []
    out: list[Path] = []
    for root in roots:
        base = root.joinpath(*parts)
        out += [base.with_suffix(".py"), base / "__init__.py"]
    return out


def module_file(name: str, roots: Sequence[Path]) -> Path | None:
    """The file of module ``name`` (see :func:`module_candidates`), None when it is not ours."""
    return next((c for c in module_candidates(name, roots) if c.is_file()), None)


def imported(path: Path, module: str) -> set[str]:
    """Module names ``path`` imports (``from a import b`` also yields ``a.b``: it may be a module).

    Imports inside functions count (lazy imports are imports), and so do
    modules named as a literal string to ``importlib.import_module`` or
    ``__import__``.  Each file is
    parsed once per process while it stays unchanged: every op's walk meets
    the shared helpers again.
    """
    try:
        stat = path.stat()
    except OSError:
        return set()
    return set(_imported(path, module, stat.st_mtime_ns, stat.st_size))


@functools.lru_cache(maxsize=4096)
def _imported(path: Path, module: str, mtime_ns: int, size: int) -> frozenset[str]:
    try:
        tree = ast.parse(path.read_bytes())
    except (OSError, SyntaxError, ValueError):
        return frozenset()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in _statements(tree.body):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute("." * node.level + (node.module or ""), package)
            if base:
                names.add(base)
                names.update(f"{base}.{a.name}" for a in node.names)
    names.update(_named_in_calls(tree, package))
    return frozenset(n for n in names if n)


#: Calls that import the module their first argument names: ``importlib.import_module("x")``
#: (also ``import_module(".x", "pkg")``) and ``__import__("x")``.
_IMPORT_CALLS = frozenset({"import_module", "__import__"})


def _literal(node: ast.expr | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _named_in_calls(tree: ast.AST, package: str) -> set[str]:
    """Modules imported by a call with the name as a literal string (a plugin table, a lazy
    import spelled as a call): ``import_module(f"ops.{name}")`` names no module and is not followed."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and node.args):
            continue
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        name = _literal(node.args[0])
        if called not in _IMPORT_CALLS or name is None:
            continue
        # relative: to the package given as a literal, else to this module's
        names.add(_absolute(name, _literal(node.args[1] if len(node.args) > 1 else None) or package))
    return names


def _absolute(name: str, package: str) -> str:
    """``name`` made absolute as Python would import it from ``package`` ("": it cannot be imported)."""
    try:
        return importlib.util.resolve_name(name, package) if name.startswith(".") else name
    except ImportError:  # no package, or above the top-level one: the import fails, nothing to follow
        return ""


def _statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Every statement, nested ones included, without descending into expressions (imports are statements)."""
    todo = list(body)
    while todo:
        node = todo.pop()
        yield node
        for name in ("body", "orelse", "finalbody", "handlers", "cases"):
            for child in getattr(node, name, ()) or ():
                if isinstance(child, ast.stmt):
                    todo.append(child)
                else:  # an except handler or a match case: its body holds statements
                    todo.extend(getattr(child, "body", ()))


@dataclass
class Closure:
    """What following imports from some modules reached: the files, and every path watched."""

    files: dict[Path, None] = field(default_factory=dict)  # existing files, in discovery order
    watched: set[Path] = field(default_factory=set)  # files + where imported modules could appear
    cuda_dirs: set[Path] = field(default_factory=set)  # a CUDA source added to one of these counts too
    #: (spec folder, glob) of the files the op reads at run time: one added or deleted counts too
    data: list[tuple[Path, str]] = field(default_factory=list)

    def covers(self, path: Path) -> bool:
        """Whether a change to ``path`` (resolved; it may no longer exist) can change the verdict."""
        if path in self.watched or (path.parent in self.cuda_dirs and path.suffix in CUDA_SUFFIXES):
            return True
        return any(_data_match(path, base, pattern) for base, pattern in self.data)


def _data_match(path: Path, base: Path, pattern: str) -> bool:
    """``path`` is one of ``pattern``'s files, or under a folder it names (relative to ``base``)."""
    rel = os.path.relpath(path, base).replace(os.sep, "/")
    glob = os.path.normpath(pattern).replace(os.sep, "/").rstrip("/")
    globs = {glob, glob.replace("**/", "")}  # fnmatch's * crosses folders; ** may also match none
    folders = [rel[:i] for i, ch in enumerate(rel) if ch == "/"]
    return any(fnmatch.fnmatchcase(name, g) for g in globs for name in (rel, *folders))


def data_files(base: Path, patterns: Iterable[str]) -> list[Path]:
    """The files ``patterns`` (globs relative to ``base``) name; a folder they match counts its files."""
    found: dict[Path, None] = {}
    for pattern in patterns:
        for hit in sorted(base.glob(pattern)):
            if hit.is_dir():
                found.update(dict.fromkeys(sorted(p.resolve() for p in hit.rglob("*") if p.is_file())))
            elif hit.is_file():
                found[hit.resolve()] = None
    return list(found)


def import_closure(modules: Iterable[str], roots: Sequence[Path], closure: Closure | None = None) -> Closure:
    """Follow ``modules`` through their imports (opgate's and ``roots``' modules only)."""
    found = closure if closure is not None else Closure()
    todo, done = list(modules), set[str]()
    while todo:
        module = todo.pop()
        if module in done:
            continue
        done.add(module)
        # importing a.b.c runs a/__init__.py and a/b/__init__.py first: they count too
        parts = module.split(".")
        todo += [p for p in (".".join(parts[:i]) for i in range(1, len(parts))) if p not in done]
        candidates = [c.resolve() for c in module_candidates(module, roots)]
        found.watched.update(candidates)
        path = next((c for c in candidates if c.is_file()), None)
        if path is not None:
            found.files[path] = None
            todo += sorted(imported(path, module) - done)
    return found


_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', re.MULTILINE)


def cuda_dependencies(sources: Sequence[Path]) -> tuple[list[Path], set[Path]]:
    """The CUDA C++ files ``sources`` build from, and every path an include of theirs could be.

    The sources' folders and the shared headers (``ops/_cuda``), as a build's
    include path sees them, and then every ``#include "..."`` followed from
    each file found, relative to that file or to the shared headers: a header
    in a subfolder (``#include "detail/math.h"``) counts, where listing the
    folders alone missed it.  ``<...>`` includes are the toolkit's and
    torch's, covered by the environment key.  Used by ``--changed-since`` and
    the verdict cache (:func:`op_closure`) and by the build cache's key
    (:func:`opgate.validators.cuda_build.source_hash`), so the three agree.
    """
    shared = SHARED_CUDA.resolve()
    todo = [p for folder in {*(s.parent for s in sources), shared} for p in _cuda_files(folder)]
    todo += [s for s in sources if s.is_file()]
    files: dict[Path, None] = {}
    watched: set[Path] = set(todo)
    while todo:
        path = todo.pop()
        if path in files:
            continue
        files[path] = None
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for name in _INCLUDE.findall(text):
            places = [(path.parent / name).resolve(), (shared / name).resolve()]
            watched.update(places)
            todo += [p for p in places if p.is_file() and p.suffix in CUDA_SUFFIXES and p not in files]
    return sorted(files), watched


def _cuda_files(folder: Path) -> list[Path]:
    return [p.resolve() for p in source_files(folder, recursive=False, suffixes=CUDA_SUFFIXES)]


def op_closure(spec: Any) -> Closure:
    """An op's spec, the Python it imports and its CUDA sources (see the module docstring)."""
    roots = [Path(spec.root).resolve()] if spec.root is not None else []
    modules = [ref.split(":")[0] for ref in (spec.reference, spec.samples)]
    found = Closure()
    spec_path = Path(spec.path).resolve()
    found.files[spec_path] = None
    for impl in spec.implementations.values():
        modules += [m for m in (impl.module, (impl.entry or "").split(":")[0]) if m]
        # its CUDA C++ sources, and those of the libraries its module builds at import: a change
        # to either changes what the op's cells run
        libraries = [src for lib in getattr(impl, "libraries", ()) for src in lib.sources]
        sources = [(spec_path.parent / src).resolve() for src in [*(impl.sources or []), *libraries]]
        if sources:
            files, watched = cuda_dependencies(sources)
            found.files.update(dict.fromkeys(files))
            found.watched.update(watched)
            found.cuda_dirs.update({*(src.parent for src in sources), SHARED_CUDA.resolve()})
    import_closure(modules, roots, found)
    data = tuple(getattr(spec, "data", ()))
    found.files.update(dict.fromkeys(data_files(spec_path.parent, data)))
    found.data += [(spec_path.parent, pattern) for pattern in data]
    found.watched.update(found.files)
    return found


def op_source_files(spec: Any) -> list[Path]:
    """Every file an op's verdict depends on, sorted (what the verdict cache digests)."""
    return sorted(op_closure(spec).files)


def _module_name(path: Path) -> str:
    rel = path.relative_to(OPGATE_DIR).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(("opgate", *parts))


def harness_closure() -> Closure:
    """The harness: every source of the validators and matrix stages, and the opgate modules they import.

    The import walk is what brings in ``matrix/spec.py`` and the schema (they
    decide how every spec reads) without counting any op's own sources.  The
    matrix stage's YAML files are configs: only the one a run uses counts.
    """
    found = Closure()
    modules: list[str] = []
    for package in HARNESS_PACKAGES:
        for path in source_files(OPGATE_DIR / package, recursive=True):
            if package == "matrix" and path.suffix != ".py":
                continue  # matrix configs count only when in use (matrix.changes)
            found.files[path.resolve()] = None
            if path.suffix == ".py":
                modules.append(_module_name(path))
    import_closure(modules, [], found)
    found.watched.update(found.files)
    return found
