"""Register a zoo forward as a ``zoo::`` custom op, with fake impl and autograd (the knobs faults turn)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def rms_backward(
    g: torch.Tensor, x: torch.Tensor, w: torch.Tensor, eps: float, *, drop_projection: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, dw) of y = x * rstd * w, in float32 (float64 for float64).

    ``drop_projection`` plants the classic wrong backward: dx = g * w * rstd,
    forgetting that rstd itself depends on x.
    """
    acc = torch.promote_types(x.dtype, torch.float32)
    xf, wf, gf = x.to(acc), w.to(acc), g.to(acc)
    rstd = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    gw = gf * wf
    dx = gw * rstd
    if not drop_projection:
        dx = dx - xf * rstd.pow(3) * (gw * xf).mean(dim=-1, keepdim=True)
    dw = (gf * xf * rstd).sum(dim=0)
    return dx.to(x.dtype), dw.to(w.dtype)


def _fake(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x.new_empty(x.shape)


def register(
    name: str,
    forward: Callable[..., torch.Tensor],
    *,
    fake: bool = True,
    fake_impl: Callable[..., torch.Tensor] = _fake,
    backward: Callable[..., tuple[torch.Tensor, torch.Tensor]] = rms_backward,
) -> Any:
    """``zoo::name`` as an opaque custom op; ``fake=False``/``fake_impl`` plant a missing or lying fake."""
    op = torch.library.custom_op(f"zoo::{name}", forward, mutates_args=())
    if fake:
        op.register_fake(fake_impl)

    attach_autograd(op, backward)
    return op


def attach_autograd(
    op: Any, backward: Callable[..., tuple[torch.Tensor, torch.Tensor]] = rms_backward
) -> None:
    """Autograd of an ``(x, w, eps)`` RMSNorm op: ``backward(g, x, w, eps) -> (dx, dw)``."""

    def setup(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
        x, w, eps = inputs
        ctx.save_for_backward(x, w)
        ctx.eps = eps

    def bwd(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        x, w = ctx.saved_tensors
        dx, dw = backward(g, x, w, ctx.eps)
        return dx, dw, None

    op.register_autograd(bwd, setup_context=setup)
