"""Planted fault: the kernel dereferences NULL on float16 inputs (a real SIGSEGV)."""

from __future__ import annotations

import ctypes

import torch
from fx_common import make_op


def _fault(x: torch.Tensor) -> None:
    if x.dtype == torch.float16:
        ctypes.string_at(0)  # reads address 0: the process dies with SIGSEGV


scale = make_op("opgate_fx::segv_scale", _fault)
