"""Planted fault: on float16 the "library" prints why and calls exit(1), as bitsandbytes' C code does.

Kept apart from ``tests/fixtures_runner`` (whose tests count its cells); self-contained for that.
"""

from __future__ import annotations

import os
import sys

import torch

from opgate.ops.base import SampleInput, randn


def reference(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def sample_inputs(
    shape: tuple[int, ...], dtype: torch.dtype, device: str, generator: torch.Generator
) -> SampleInput:
    return SampleInput(args=(randn(tuple(shape), dtype, device, generator),), grad_args=(0,))


@torch.library.custom_op("opgate_fx::exit_scale", mutates_args=())
def scale(x: torch.Tensor) -> torch.Tensor:
    if x.dtype == torch.float16:
        print("Error invalid argument at line 74 in file /src/csrc/ops.cu", file=sys.stderr, flush=True)
        os._exit(1)
    return x * 2


@scale.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def _backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
    return grad * 2


scale.register_autograd(_backward)
