"""Shared parts of the runner's planted ops: a correct ``y = 2 * x`` op and a fault hook.

Each planted op (``fx_segv``, ``fx_hang``, ``fx_flaky``) registers its own
torch.library custom op whose kernel is correct except for one planted fault,
so every cell the fault does not touch must pass all checks: that is what
proves a crash or hang in one cell leaves the other verdicts intact.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from opgate.ops.base import SampleInput, randn


def scale(x: torch.Tensor) -> torch.Tensor:
    """Reference (and float64 oracle): exact in every dtype, so errors are 0 vs 0."""
    return x * 2


def sample_inputs(
    shape: tuple[int, ...], dtype: torch.dtype, device: str, generator: torch.Generator
) -> SampleInput:
    return SampleInput(
        args=(randn(tuple(shape), dtype, device, generator),), layout_args=(0,), grad_args=(0,)
    )


def make_op(
    qualname: str, fault: Callable[[torch.Tensor], torch.Tensor | None]
) -> Callable[..., torch.Tensor]:
    """Register ``qualname`` as a custom op (fake + autograd) running ``fault(x)`` first.

    ``fault`` may crash, hang, or return a wrong result to use instead of ``2 * x``.
    """

    @torch.library.custom_op(qualname, mutates_args=())
    def op(x: torch.Tensor) -> torch.Tensor:
        wrong = fault(x)
        return wrong if wrong is not None else x * 2

    @op.register_fake
    def _(x: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(x)

    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
        return grad * 2

    op.register_autograd(backward)
    return op
