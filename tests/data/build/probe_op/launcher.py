"""An op written the ordinary way around the planted Triton kernel: a Python launcher, as libraries do."""

from __future__ import annotations

import torch
import triton

from opgate.ops.base import SampleInput
from tests.data.build.probe_op.triton_kernels import _probe_scale_kernel


def probe(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    n = x.numel()
    _probe_scale_kernel[(triton.cdiv(n, 256),)](x, y, n, 2.0, BLOCK=256, num_warps=2)
    return y


def sample_inputs(
    shape: tuple[int, ...], dtype: torch.dtype, device: str, generator: torch.Generator
) -> SampleInput:
    return SampleInput(args=(torch.randn(shape, generator=generator).to(device=device, dtype=dtype),))
