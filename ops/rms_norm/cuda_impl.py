"""opgate_cuda::rms_norm — the CUDA C++ RMSNorm, registered for torch.compile and autograd.

The C++ extension (ops/rms_norm/cuda/) defines the schema and the CUDA kernel
on the ``CUDA`` dispatch key.  This module has opgate's build
(:mod:`opgate.ops._extension`) build it from the spec (cached) and load it,
and adds what C++ leaves out: a fake (meta) kernel so compile/export can trace
shapes without running it, and an autograd formula that calls
``opgate_cuda::rms_norm_backward``.  Importing it on a CPU-only torch, or
outside opgate, raises :class:`opgate.ops._extension.CudaBuildUnsupported`.
"""

from __future__ import annotations

from typing import Any

import torch

from opgate.ops._extension import load_for_spec

#: sources and arch list come from the ``cuda`` implementation in spec.yaml (the one declaration)
BUILT = load_for_spec(__name__)


def _rms_norm_fake(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


torch.library.register_fake("opgate_cuda::rms_norm", _rms_norm_fake)


def _rms_norm_backward_fake(
    grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    return (
        torch.empty(x.shape, dtype=x.dtype, device=x.device),
        torch.empty(weight.shape, dtype=weight.dtype, device=weight.device),
    )


torch.library.register_fake("opgate_cuda::rms_norm_backward", _rms_norm_backward_fake)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    x, weight, eps = inputs
    ctx.save_for_backward(x, weight)
    ctx.eps = eps


def _backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:
    x, weight = ctx.saved_tensors
    dx, dw = torch.ops.opgate_cuda.rms_norm_backward(grad, x, weight, ctx.eps)
    return (dx if ctx.needs_input_grad[0] else None, dw if ctx.needs_input_grad[1] else None, None)


torch.library.register_autograd("opgate_cuda::rms_norm", _backward, setup_context=_setup_context)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """y = x / sqrt(mean(x^2, -1) + eps) * weight, computed by opgate's CUDA kernel (CUDA tensors only)."""
    y: torch.Tensor = torch.ops.opgate_cuda.rms_norm(x, weight, eps)
    return y
