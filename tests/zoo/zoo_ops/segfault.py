"""``zoo::segfault_rms_norm``: planted: a native crash (SIGSEGV) on every call.

Writes through a null pointer via ctypes, as a kernel binding handed a null buffer would.
Kills the worker process: the runner must record ``error`` naming the signal
and keep every other cell's verdict.
"""

from __future__ import annotations

import ctypes

import torch

from zoo_ops.register import register


def _forward(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    ctypes.memset(0, 0, 1)
    return x.new_empty(x.shape)


rms_norm = register("segfault_rms_norm", _forward)
