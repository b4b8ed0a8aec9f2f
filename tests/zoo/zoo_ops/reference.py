"""Reference and sample inputs shared by every zoo op (RMSNorm over the last dim of a 2-d x)."""

from __future__ import annotations

import torch

from opgate.ops.base import SampleInput, randn


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Accumulates in float32 (float64 for float64, so it is also the oracle) and rounds once."""
    acc = torch.promote_types(x.dtype, torch.float32)
    xf = x.to(acc)
    rstd = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (xf * rstd * w.to(acc)).to(x.dtype)


def rms_norm_float(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """The same RMSNorm written the way model code writes it: explicit ``.float()``, back with ``.to``.

    Handed float64 inputs, this computes in float32; opgate's oracle maps the casts to float64.
    """
    xf = x.float()
    variance = xf.pow(2).mean(-1, keepdim=True)
    return (xf * torch.rsqrt(variance + eps) * w.float()).to(x.dtype)


def sample_inputs(
    shape: tuple[int, ...], dtype: torch.dtype, device: str, generator: torch.Generator
) -> SampleInput:
    if len(shape) != 2:
        raise ValueError(f"zoo ops take 2-d x (M, N), got shape {shape}")
    x = randn(tuple(shape), dtype, device, generator)
    w = (1.0 + 0.5 * randn((shape[-1],), torch.float32, device, generator)).to(dtype)
    return SampleInput(
        args=(x, w), kwargs={"eps": 1e-6}, layout_args=(0,), grad_args=(0, 1), broadcastable=(0,)
    )
