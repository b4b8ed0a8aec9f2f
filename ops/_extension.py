"""How opgate's own compiled pieces reach the payload without the payload importing the harness.

Two parts of ``ops/`` need a C++ library: the CUDA C++ ops (``*/cuda_impl.py``,
built from their spec's ``sources`` and ``arch_policy``) and the launch replay
(``_replay``).  What to build is declared by the payload; *how* to build it
(the nvcc of the right CUDA version, the build cache, the child compiler
process: the very build the ``build`` cells inspect) belongs to the harness,
:mod:`opgate.validators.cuda_build`.  ``ops/`` is the code under test and
imports none of the stages, so the harness hands its builder over here
(:func:`install`, done when ``opgate.validators`` is imported: every worker,
``opgate perf``, the tests) and the payload asks through this module.

Imported outside opgate (no builder installed), a CUDA op raises
:class:`CudaBuildUnsupported` saying so, the way it does on a CPU-only torch,
and the launch replay stays off (the Python launch path runs).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol


class CudaBuildUnsupported(Exception):
    """This torch cannot build or load a CUDA extension with this nvcc (an ``unsupported`` verdict)."""


class Builder(Protocol):
    """What the harness provides (:mod:`opgate.validators.cuda_build`)."""

    def load_for_spec(self, module_name: str) -> Any:
        """Build (cached) and load the library of the spec implementation whose module this is."""

    def load_library(
        self,
        name: str,
        sources: Sequence[Path],
        sass: Sequence[str],
        ptx: bool = False,
        *,
        install: bool = True,
    ) -> Any:
        """Build (cached) and load a library; the result has ``.library`` (its path)."""

    def cached_library(
        self, name: str, sources: Sequence[Path], sass: Sequence[str], ptx: bool
    ) -> Path | None:
        """The finished build of this key, if there is one, without compiling (a quick look)."""


NO_BUILDER = (
    "no opgate builder is installed: opgate's compiled ops are built by its harness "
    "(import opgate.validators first, or run them through `opgate run` / `opgate perf`)"
)
_INSTALLED: list[Builder] = []


def install(builder: Builder) -> None:
    """Make ``builder`` the one the payload uses (the harness calls this once per process)."""
    _INSTALLED[:] = [builder]


def builder() -> Builder:
    """The installed builder; :class:`CudaBuildUnsupported` when there is none."""
    if not _INSTALLED:
        raise CudaBuildUnsupported(NO_BUILDER)
    return _INSTALLED[0]


def load_for_spec(module_name: str) -> Any:
    """``BUILT = load_for_spec(__name__)`` in a CUDA op module: its library, built from its spec."""
    return builder().load_for_spec(module_name)
