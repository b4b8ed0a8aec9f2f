"""Plain PyTorch RMSNorm: the reference every ``rms_norm`` implementation is judged against.

Accumulates in float32 (float64 stays float64, so the same function is the
oracle) and rounds once at the end, which is what a careful kernel does too:
the tolerance rule then compares like with like.
"""

from __future__ import annotations

import torch

from opgate.ops.base import SampleInput, randn


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    acc = torch.promote_types(x.dtype, torch.float32)
    xf = x.to(acc)
    rstd = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (xf * rstd * w.to(acc)).to(x.dtype)


def sample_inputs(
    shape: tuple[int, ...], dtype: torch.dtype, device: str, generator: torch.Generator
) -> SampleInput:
    """x of ``shape`` (..., N) and a weight w (N,) away from zero; eps as a keyword."""
    x = randn(tuple(shape), dtype, device, generator)
    w = (1.0 + 0.5 * randn((shape[-1],), torch.float32, device, generator)).to(dtype)
    return SampleInput(
        args=(x, w), kwargs={"eps": 1e-6}, layout_args=(0,), grad_args=(0, 1), broadcastable=(0, 1)
    )
