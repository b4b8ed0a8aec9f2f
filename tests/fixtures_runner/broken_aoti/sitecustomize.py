"""Plants an environment whose AOTInductor loader segfaults, as torch 2.11's did on the H200 image.

Put this folder first on ``PYTHONPATH``: every interpreter of the run (the
runner, fork servers, workers) imports it at start-up, and once
``torch._inductor`` has been imported its ``aoti_load_package`` kills the
process with SIGSEGV, for any package, custom op or not.  Nothing else
changes: packages still compile, every other mode works.
"""

from __future__ import annotations

import importlib.abc
import os
import signal
import sys
from typing import Any


def _segfault(*args: Any, **kwargs: Any) -> Any:
    os.kill(os.getpid(), signal.SIGSEGV)


class _BreakAotiLoad(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "torch._inductor":
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader.exec_module = _then_break(spec.loader.exec_module)  # type: ignore[method-assign]
                return spec
        return None


def _then_break(load: Any) -> Any:
    def exec_module(module: Any) -> None:
        load(module)
        module.aoti_load_package = _segfault

    return exec_module


sys.meta_path.insert(0, _BreakAotiLoad())
