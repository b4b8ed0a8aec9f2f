"""opgate_cuda::silu_mul — the CUDA C++ SwiGLU gate, registered for torch.compile and autograd.

The C++ extension (ops/silu_mul/cuda/) defines the schema and the CUDA kernel;
this module has opgate's build (:mod:`opgate.ops._extension`) build it from
the spec (cached) and load it, and registers the fake kernels and the autograd
formula (``opgate_cuda::silu_mul_backward``).  Importing it on a CPU-only torch,
or outside opgate, raises :class:`opgate.ops._extension.CudaBuildUnsupported`.
"""

from __future__ import annotations

from typing import Any

import torch

from opgate.ops._extension import load_for_spec

#: sources and arch list come from the ``cuda`` implementation in spec.yaml (the one declaration)
BUILT = load_for_spec(__name__)


def _silu_mul_fake(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.empty(a.shape, dtype=a.dtype, device=a.device)


torch.library.register_fake("opgate_cuda::silu_mul", _silu_mul_fake)


def _silu_mul_backward_fake(
    grad: torch.Tensor, a: torch.Tensor, b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    return (
        torch.empty(a.shape, dtype=a.dtype, device=a.device),
        torch.empty(a.shape, dtype=a.dtype, device=a.device),
    )


torch.library.register_fake("opgate_cuda::silu_mul_backward", _silu_mul_backward_fake)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    a, b = inputs
    ctx.save_for_backward(a, b)


def _backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    a, b = ctx.saved_tensors
    da, db = torch.ops.opgate_cuda.silu_mul_backward(grad, a, b)
    return (da if ctx.needs_input_grad[0] else None, db if ctx.needs_input_grad[1] else None)


torch.library.register_autograd("opgate_cuda::silu_mul", _backward, setup_context=_setup_context)


def silu_mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """silu(a) * b computed by opgate's CUDA kernel (CUDA tensors only), fp32 math, one rounding."""
    y: torch.Tensor = torch.ops.opgate_cuda.silu_mul(a, b)
    return y
