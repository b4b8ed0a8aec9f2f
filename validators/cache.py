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

import hashlib
import json
import os
import platform
import re
import sys
from collections.abc import Iterable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from matrix.cell import Cell
from matrix.errors import ResultsFormatError
from validators.result import CellResult, Verdict

CACHE_VERSION = 1
CACHEABLE = frozenset({Verdict.PASS, Verdict.FAIL, Verdict.FALLBACK, Verdict.UNSUPPORTED})
SOURCE_SUFFIXES = frozenset(
    {".py", ".yaml", ".yml", ".cu", ".cuh", ".cpp", ".cc", ".c", ".h", ".hpp", ".inl"}
)
VALIDATORS_DIR = Path(__file__).resolve().parent


def default_root() -> Path:
    """``$OPGATE_CACHE`` or ``<repo>/.opgate-cache/verdicts`` (ignored by git)."""
    env = os.environ.get("OPGATE_CACHE")
    return Path(env) if env else VALIDATORS_DIR.parent / ".opgate-cache" / "verdicts"


def _source_files(folder: Path, recursive: bool) -> Iterable[Path]:
    pattern = folder.rglob("*") if recursive else folder.glob("*.py")
    for path in sorted(pattern):
        rel = path.relative_to(folder).parts
        if (
            path.is_file()
            and path.suffix in SOURCE_SUFFIXES
            and not any(p.startswith(".") or p in ("__pycache__", "build") for p in rel)
        ):
            yield path


_SIBLING_IMPORT = re.compile(r"^\s*(?:from|import)\s+\w+\.(\w+)", re.MULTILINE)


def op_folders(folder: Path) -> set[Path]:
    """The op's folder, the shared ``_*`` folders beside it, and sibling op folders it imports.

    An op's verdict depends on more than its own folder: opgate's ops share
    launch helpers (``ops/_triton_util.py``), CUDA headers (``ops/_cuda/``) and
    kernels (``fused_add_rms_norm`` imports ``ops.rms_norm``).  Any change there
    must invalidate the cached verdict, so all of it is hashed.
    """
    parent = folder.parent
    found = {folder} | {d for d in parent.iterdir() if d.is_dir() and d.name.startswith("_")}
    todo = [folder]
    while todo:
        current = todo.pop()
        for path in current.rglob("*.py"):
            for name in _SIBLING_IMPORT.findall(path.read_text(errors="replace")):
                sibling = parent / name
                if sibling.is_dir() and sibling not in found:
                    found.add(sibling)
                    todo.append(sibling)
    return found


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
        folder = Path(spec.path).resolve().parent
        if folder not in self._ops:
            parent = folder.parent
            files = [*_source_files(parent, recursive=False)]
            for dep in sorted(op_folders(folder)):
                files += _source_files(dep, recursive=True)
            self._ops[folder] = tree_digest(dict.fromkeys(files), parent)
        return self._ops[folder]

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
