"""Plain PyTorch residual add + RMSNorm, the reference (and, in float64, the oracle).

The new residual is rounded to the input dtype before it is normalized: that is
the value a transformer block carries forward, so y must be the norm *of it*.
"""

from __future__ import annotations

import torch

from opgate.ops.base import SampleInput, randn
from opgate.ops.rms_norm.reference import rms_norm


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual, w, eps), x + residual)."""
    h = x + residual
    return rms_norm(h, w, eps), h


def sample_inputs(
    shape: tuple[int, ...], dtype: torch.dtype, device: str, generator: torch.Generator
) -> SampleInput:
    """x and residual of ``shape`` (..., N) (both take the cell's layout), weight w (N,)."""
    x = randn(tuple(shape), dtype, device, generator)
    residual = randn(tuple(shape), dtype, device, generator)
    w = (1.0 + 0.5 * randn((shape[-1],), torch.float32, device, generator)).to(dtype)
    return SampleInput(
        args=(x, residual, w),
        kwargs={"eps": 1e-6},
        layout_args=(0, 1),
        grad_args=(0, 1, 2),
        broadcastable=(0, 1, 2),
    )
