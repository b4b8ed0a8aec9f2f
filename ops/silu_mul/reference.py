"""Plain PyTorch SwiGLU gate, silu(a) * b: the reference, and in float64 the oracle.

Computed in float32 (float64 stays float64) and rounded once, like the kernel.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from opgate.ops.base import SampleInput, randn


def silu_mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    acc = torch.promote_types(a.dtype, torch.float32)
    return (F.silu(a.to(acc)) * b.to(acc)).to(a.dtype)


def sample_inputs(
    shape: tuple[int, ...], dtype: torch.dtype, device: str, generator: torch.Generator
) -> SampleInput:
    """Gate a and up-projection b, both of ``shape`` (..., N); both take the cell's layout."""
    a = (2.0 * randn(tuple(shape), torch.float32, device, generator)).to(dtype)
    b = randn(tuple(shape), dtype, device, generator)
    return SampleInput(args=(a, b), layout_args=(0, 1), grad_args=(0, 1), broadcastable=(0, 1))
