"""Verdict cache: re-validate only what changed.

A verdict holds for (the op's sources and spec, opgate's validators, the
environment, the cell with its overrides).  When none of these changed, the
previous record is served instead of re-running the cell, so re-validating
after editing one op costs that op's cells only; ``--no-cache`` re-runs
everything (and refreshes the cache).

What goes into the key, and why:

* **op sources**: the op's spec, the Python its references import (followed
  through imports: :mod:`opgate.matrix.sources`) and its CUDA sources, plus
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

import functools
import hashlib
import json
import os
import platform
import sys
from collections.abc import Iterable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from opgate.matrix.cell import Cell
from opgate.matrix.errors import ResultsFormatError
from opgate.matrix.sources import OPGATE_DIR, op_source_files, source_files
from opgate.matrix.spec_schema import CONTROL_IMPL
from opgate.validators.env import platform_name
from opgate.validators.result import CellResult, Verdict

CACHE_VERSION = 1
CACHEABLE = frozenset(
    {Verdict.PASS, Verdict.FAIL, Verdict.FALLBACK, Verdict.UNSUPPORTED, Verdict.ENVIRONMENT}
)
#: A control is stored only beside the ``environment`` cell it explains (:meth:`VerdictCache.put`
#: with ``explains``), so its failure is served with that cell: a later run of the same sources
#: in the same environment need not crash twice more to say the mode is broken here.
CONTROL_CACHEABLE = CACHEABLE | {Verdict.ERROR}
VALIDATORS_DIR = Path(__file__).resolve().parent


def user_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/opgate`` (default ``~/.cache/opgate``): caches never go into site-packages."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "opgate"


def default_root() -> Path:
    """``$OPGATE_CACHE`` or the user cache folder's ``verdicts``."""
    env = os.environ.get("OPGATE_CACHE")
    return Path(env) if env else user_cache_dir() / "verdicts"


def identity_digest(identity: Mapping[str, Any]) -> str:
    """16 hex digits for an environment identity (:func:`environment_identity`): its files' name."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def tree_digest(files: Iterable[Path], base: Path) -> str:
    h = hashlib.sha256()
    for path in files:
        h.update(str(path.relative_to(base)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


@functools.cache
def _version(dist: str) -> str:
    """Asked per cell key; fixed for the run (a metadata scan costs ~1 ms)."""
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
        "platform": platform_name(),
        "gpus": [{k: g.get(k) for k in ("name", "capability")} for g in gpus],
        "nvcc": dict(sorted(nvcc.items())),
    }


class VerdictCache:
    """Look-up and store of final cell records under the key described above."""

    def __init__(self, root: Path, environment: Mapping[str, Any]) -> None:
        self.root = root
        self._env = json.dumps(environment, sort_keys=True)
        #: 16 hex digits naming this environment's files beside the cache (history, Triton variants)
        self.environment_digest = identity_digest(environment)
        self._validators = tree_digest(source_files(VALIDATORS_DIR, recursive=True), VALIDATORS_DIR)
        self._ops: dict[str, str] = {}
        self._keys: dict[tuple[str, str, str], str] = {}  # a run asks for each key twice (has, get)

    def op_digest(self, spec: Any) -> str:
        """The digest of an op's sources (spec, modules, libraries): what a verdict of it rests on."""
        path = str(spec.path)  # asked per cell: no resolve() (a realpath per call) in the lookup
        if path not in self._ops:
            h = hashlib.sha256()
            for file in op_source_files(spec):
                name = file.relative_to(OPGATE_DIR) if file.is_relative_to(OPGATE_DIR) else file
                h.update(str(name).encode() + b"\0" + file.read_bytes() + b"\0")
            self._ops[path] = h.hexdigest()
        return self._ops[path]

    def key(self, cell: Cell, spec: Any) -> str:
        memo = (str(spec.path), cell.id, repr(cell.overrides))
        cached = self._keys.get(memo)
        if cached is not None:
            return cached
        impl = spec.implementations.get(cell.impl)
        requires = {d: _version(d) for d in getattr(impl, "requires", []) or []}
        material = {
            "cache_version": CACHE_VERSION,
            "cell": cell.to_json(),
            "op": self.op_digest(spec),
            "requires": requires,
            "validators": self._validators,
            "env": self._env,
        }
        key = hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()
        self._keys[memo] = key
        return key

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def has(self, cell: Cell, spec: Any) -> bool:
        """Whether a record is stored for the cell (cheap: before any worker starts, per cell)."""
        return self._path(self.key(cell, spec)).is_file()

    def get(self, cell: Cell, spec: Any, log: Path | None = None) -> CellResult | None:
        """The stored record, or None; its worker log is copied to ``log`` (a served cell keeps its log)."""
        path = self._path(self.key(cell, spec))
        try:
            result = CellResult.from_json(json.loads(path.read_text()))
        except (OSError, ValueError, ResultsFormatError):
            return None
        allowed = CONTROL_CACHEABLE if cell.impl == CONTROL_IMPL else CACHEABLE
        if result.id != cell.id or result.verdict not in allowed:
            return None
        stored_log = path.with_suffix(".log")
        if log is not None and stored_log.exists():
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text(
                f"=== served from the verdict cache ({path})\n" + stored_log.read_text(errors="replace")
            )
        return result

    def put(self, result: CellResult, spec: Any, log: Path | None = None, *, explains: bool = False) -> None:
        """Store a final record; a control's failure only when it ``explains`` an environment cell."""
        allowed = CONTROL_CACHEABLE if explains and result.cell.impl == CONTROL_IMPL else CACHEABLE
        if result.verdict not in allowed:
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
