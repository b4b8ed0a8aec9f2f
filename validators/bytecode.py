"""A bytecode cache for a run's processes when the interpreter keeps none.

Why: every worker kind's fork server, the environment probe and every
control import torch, Triton, Dynamo and Inductor in a fresh interpreter.
Container images often set ``PYTHONDONTWRITEBYTECODE=1`` and ship packages
installed with ``--no-compile``: no ``.pyc`` exists and none is ever written,
so each of those imports compiles torch's Python sources again.  On the H200
runner's image ``import torch, triton, torch._dynamo, torch._inductor.compile_fx``
took 10.7-11.1 s every time; with the bytecode cached, 4.0-4.2 s.  In a cold
run the GPU lanes sit idle through the cuda server's imports.

How: when the interpreter would cache no bytecode for torch (no ``.pyc``
beside its sources, and writing is off or the folder is read-only), a run
gives itself and its child processes ``PYTHONPYCACHEPREFIX`` (opgate's own
folder, :func:`default_dir`) and turns the write-off flag off for them.  The
image's site-packages are never written: the bytecode goes under the prefix,
keyed by each source's path, and Python checks each file's source mtime and
size before using it, so a changed install is recompiled, not misread.  A
``PYTHONPYCACHEPREFIX`` of the user's own is left alone, as is an
interpreter that already has (or writes) torch's bytecode: with a prefix set,
Python would ignore the ``.pyc`` files beside the sources.

``OPGATE_BYTECODE_CACHE``: a folder to use instead, or ``0`` to leave the
interpreter as it is.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path

from opgate.validators.options import switched_off

VARIABLE = "OPGATE_BYTECODE_CACHE"
#: The package whose imports dominate a worker's start: where bytecode is looked for.
PACKAGE = "torch"


@dataclass(frozen=True)
class Decision:
    """Whether a run caches bytecode itself, where, and why (for run.json and the log)."""

    folder: Path | None
    reason: str

    def to_json(self) -> dict[str, str | None]:
        return {"folder": str(self.folder) if self.folder else None, "reason": self.reason}


def default_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CACHE_HOME/opgate/bytecode`` (the user cache folder's, like the verdicts')."""
    base = (os.environ if environ is None else environ).get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "opgate" / "bytecode"


def _package_init(name: str) -> Path | None:
    """The ``__init__.py`` of the installed package ``name``, found without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    return Path(spec.origin)


def decide(
    environ: MutableMapping[str, str],
    *,
    writes_off: bool | None = None,
    package_init: Callable[[str], Path | None] = _package_init,
) -> Decision:
    """Whether this run should give its processes a bytecode cache (see the module doc)."""
    setting = environ.get(VARIABLE, "").strip()
    if switched_off(environ, VARIABLE):
        return Decision(None, f"{VARIABLE}={setting}: the interpreter's own bytecode handling")
    if environ.get("PYTHONPYCACHEPREFIX"):
        return Decision(None, "PYTHONPYCACHEPREFIX is set: the user's bytecode cache")
    source = package_init(PACKAGE)
    if source is None:
        return Decision(None, f"no installed {PACKAGE} with Python sources to cache")
    if writes_off is None:
        writes_off = bool(sys.flags.dont_write_bytecode) or bool(environ.get("PYTHONDONTWRITEBYTECODE"))
    needed, reason = _needed(source, writes_off=writes_off)
    return Decision((Path(setting) if setting else default_dir(environ)) if needed else None, reason)


def _needed(source: Path, *, writes_off: bool) -> tuple[bool, str]:
    """Whether the interpreter would keep no bytecode for the package of ``source``, and why."""
    beside = source.parent / "__pycache__" / f"{source.stem}.{sys.implementation.cache_tag}.pyc"
    if beside.is_file():
        return False, f"{PACKAGE}'s bytecode is installed ({beside.parent})"
    if writes_off:
        return True, "PYTHONDONTWRITEBYTECODE is set and no bytecode is installed"
    if not os.access(beside.parent if beside.parent.is_dir() else source.parent, os.W_OK):
        return True, f"no bytecode is installed and {source.parent} is read-only"
    return False, "the interpreter writes bytecode beside the sources"


def apply(
    environ: MutableMapping[str, str] | None = None,
    *,
    package_init: Callable[[str], Path | None] = _package_init,
) -> Decision:
    """Decide (:func:`decide`) and, if so, set the variables every child process inherits.

    The folder is made here; one that cannot be made leaves the interpreter
    as it is (the reason says why): a cache is never a reason to fail a run.
    """
    env = os.environ if environ is None else environ
    decision = decide(env, package_init=package_init)
    if decision.folder is None:
        return decision
    try:
        decision.folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return Decision(None, f"bytecode cache {decision.folder} not made: {exc.strerror or exc}")
    env["PYTHONPYCACHEPREFIX"] = str(decision.folder)
    env["PYTHONDONTWRITEBYTECODE"] = ""  # Python reads an empty value as unset
    return decision
