"""Verdict cache: re-validate only what changed.

A verdict holds for (the op's sources and spec, opgate's validators, the
environment, the cell with its overrides).  When none of these changed, the
previous record is served instead of re-running the cell, so re-validating
after editing one op costs that op's cells only; ``--no-cache`` re-runs
everything (and refreshes the cache).

What goes into the key, and why:

* **op sources**: every source file in the op's folder, plus the loose
  ``*.py`` files next to that folder (``ops/base.py``, shared utilities), plus
  the installed version of every distribution the implementation requires;
* **validators**: every ``*.py`` of the ``validators`` package (a new check
  or a fixed tolerance rule re-judges everything);
* **environment**: torch/triton/python versions, platform, GPUs and nvcc,
  read without importing torch (the key is needed before any worker starts);
* **cell**: its id and overrides (a tolerance override changes the verdict).

Only settled verdicts are stored (pass, fail, fallback, unsupported); an
``error``, ``flaky`` or ``skip`` says something about this run, so it re-runs.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import platform
import sys
from collections.abc import Iterable, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from opgate.matrix.cell import Cell
from opgate.matrix.errors import ResultsFormatError
from opgate.validators.result import CellResult, Verdict

CACHE_VERSION = 1
CACHEABLE = frozenset({Verdict.PASS, Verdict.FAIL, Verdict.FALLBACK, Verdict.UNSUPPORTED})
SOURCE_SUFFIXES = frozenset(
    {".py", ".yaml", ".yml", ".cu", ".cuh", ".cpp", ".cc", ".c", ".h", ".hpp", ".inl"}
)
#: What a CUDA C++ implementation's folder contributes (its .py files count only if imported).
CUDA_SUFFIXES = frozenset({".cu", ".cuh", ".cpp", ".cc", ".c", ".h", ".hpp", ".inl"})
VALIDATORS_DIR = Path(__file__).resolve().parent
#: The folder holding opgate's stages (``matrix``, ``validators``, ``ops``, ``reports``): the
#: checkout's root, or ``site-packages/opgate`` once installed.
OPGATE_DIR = VALIDATORS_DIR.parent
#: Headers shared by every opgate CUDA op (on each build's include path).
SHARED_CUDA = OPGATE_DIR / "ops" / "_cuda"


def user_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/opgate`` (default ``~/.cache/opgate``): caches never go into site-packages."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "opgate"


def default_root() -> Path:
    """``$OPGATE_CACHE`` or the user cache folder's ``verdicts``."""
    env = os.environ.get("OPGATE_CACHE")
    return Path(env) if env else user_cache_dir() / "verdicts"


def _source_files(
    folder: Path, recursive: bool, suffixes: frozenset[str] = frozenset({".py"})
) -> Iterable[Path]:
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


def _module_file(name: str, roots: Sequence[Path]) -> Path | None:
    """The file of module ``name``: opgate's own (``opgate.<stage>...``) or under one of ``roots``.

    None for everything else: a third-party module is covered by its version in
    the environment key, and never walked (site-packages is not an op's source).
    """
    parts = name.split(".")
    if parts[0] == "opgate":
        roots, parts = [OPGATE_DIR], parts[1:]
        if not parts:
            return None
    for root in roots:
        base = root.joinpath(*parts)
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


def _imported(path: Path, module: str) -> set[str]:
    """Module names ``path`` imports (``from a import b`` also yields ``a.b``: it may be a module)."""
    try:
        tree = ast.parse(path.read_text(errors="replace"))
    except SyntaxError:
        return set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names)
    return {n for n in names if n}


def op_source_files(spec: Any) -> list[Path]:
    """Every file an op's verdict depends on: its spec, the Python it imports, its CUDA sources.

    Followed from the spec's own references (entry, module, reference, samples)
    through their imports, so a shared helper (``ops/_triton_util.py``) or a
    sibling op's kernels that ``fused_add_rms_norm`` imports are covered, while an
    unrelated op's change (or a self-test script nothing imports) is not.
    Third-party modules are covered by their versions in the environment key.
    """
    roots = [Path(spec.root).resolve()] if spec.root is not None else []
    todo = [ref.split(":")[0] for ref in (spec.reference, spec.samples)]
    files: dict[Path, None] = {Path(spec.path).resolve(): None}
    for impl in spec.implementations.values():
        todo += [m for m in (impl.module, (impl.entry or "").split(":")[0]) if m]
        for src in impl.sources or []:
            folder = (Path(spec.path).resolve().parent / src).parent
            files.update(dict.fromkeys(_source_files(folder, recursive=False, suffixes=CUDA_SUFFIXES)))
            files.update(dict.fromkeys(_source_files(SHARED_CUDA, recursive=False, suffixes=CUDA_SUFFIXES)))
    done: set[str] = set()
    while todo:
        module = todo.pop()
        if module in done:
            continue
        done.add(module)
        path = _module_file(module, roots)
        if path is not None:
            files[path.resolve()] = None
            todo += sorted(_imported(path, module) - done)
    return sorted(files)


def tree_digest(files: Iterable[Path], base: Path) -> str:
    h = hashlib.sha256()
    for path in files:
        h.update(str(path.relative_to(base)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "absent"


def environment_identity(gpus: Iterable[Mapping[str, Any]], nvcc: Mapping[str, str]) -> dict[str, Any]:
    """What a verdict depends on in the environment, known before any worker starts."""
    return {
        "torch": _version("torch"),
        "triton": _version("triton"),
        "python": platform.python_version(),
        "executable": sys.executable,
        "platform": platform.platform(),
        "gpus": [{k: g.get(k) for k in ("name", "capability")} for g in gpus],
        "nvcc": dict(sorted(nvcc.items())),
    }


class VerdictCache:
    """Look-up and store of final cell records under the key described above."""

    def __init__(self, root: Path, environment: Mapping[str, Any]) -> None:
        self.root = root
        self._env = json.dumps(environment, sort_keys=True)
        self._validators = tree_digest(_source_files(VALIDATORS_DIR, recursive=True), VALIDATORS_DIR)
        self._ops: dict[Path, str] = {}

    def _op_digest(self, spec: Any) -> str:
        path = Path(spec.path).resolve()
        if path not in self._ops:
            h = hashlib.sha256()
            for file in op_source_files(spec):
                name = file.relative_to(OPGATE_DIR) if file.is_relative_to(OPGATE_DIR) else file
                h.update(str(name).encode() + b"\0" + file.read_bytes() + b"\0")
            self._ops[path] = h.hexdigest()
        return self._ops[path]

    def key(self, cell: Cell, spec: Any) -> str:
        impl = spec.implementations.get(cell.impl)
        requires = {d: _version(d) for d in getattr(impl, "requires", []) or []}
        material = {
            "cache_version": CACHE_VERSION,
            "cell": cell.to_json(),
            "op": self._op_digest(spec),
            "requires": requires,
            "validators": self._validators,
            "env": self._env,
        }
        return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, cell: Cell, spec: Any, log: Path | None = None) -> CellResult | None:
        """The stored record, or None; its worker log is copied to ``log`` (a served cell keeps its log)."""
        path = self._path(self.key(cell, spec))
        try:
            result = CellResult.from_json(json.loads(path.read_text()))
        except (OSError, ValueError, ResultsFormatError):
            return None
        if result.id != cell.id or result.verdict not in CACHEABLE:
            return None
        stored_log = path.with_suffix(".log")
        if log is not None and stored_log.exists():
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text(
                f"=== served from the verdict cache ({path})\n" + stored_log.read_text(errors="replace")
            )
        return result

    def put(self, result: CellResult, spec: Any, log: Path | None = None) -> None:
        if result.verdict not in CACHEABLE:
            return
        path = self._path(self.key(result.cell, spec))
        path.parent.mkdir(parents=True, exist_ok=True)
        if log is not None and log.exists():
            _atomic_write(path.with_suffix(".log"), log.read_text(errors="replace"))
        _atomic_write(path, json.dumps(result.to_json()))


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)
