"""Plain PyTorch LayerNorm with optional exact (erf) GELU: reference, and in float64 the oracle."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from opgate.ops.base import SampleInput, randn


def layer_norm(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float = 1e-5, gelu: bool = False
) -> torch.Tensor:
    """gelu?(layer_norm(x) * w + b), computed in float32 (float64 stays float64), rounded once."""
    acc = torch.promote_types(x.dtype, torch.float32)
    y = F.layer_norm(x.to(acc), (x.shape[-1],), w.to(acc), b.to(acc), eps)
    if gelu:
        y = F.gelu(y)
    return y.to(x.dtype)


def sample_inputs(
    shape: tuple[int, ...], dtype: torch.dtype, device: str, generator: torch.Generator
) -> SampleInput:
    """``shape`` = [..., N, G]: x is (..., N); G = 1 fuses the GELU, 0 does not.

    x gets a non-zero mean (as activations have) so a one-pass variance would show.
    """
    if len(shape) < 2 or shape[-1] not in (0, 1):
        raise ValueError(f"layer_norm shapes are [..., N, G] with G in (0, 1), got {list(shape)}")
    dims, gelu = tuple(shape[:-1]), bool(shape[-1])
    x = (3.0 + randn(dims, torch.float32, device, generator)).to(dtype)
    w = (1.0 + 0.5 * randn((dims[-1],), torch.float32, device, generator)).to(dtype)
    b = (0.5 * randn((dims[-1],), torch.float32, device, generator)).to(dtype)
    return SampleInput(
        args=(x, w, b),
        kwargs={"eps": 1e-5, "gelu": gelu},
        layout_args=(0,),
        grad_args=(0, 1, 2),
        broadcastable=(0, 1, 2),
    )
