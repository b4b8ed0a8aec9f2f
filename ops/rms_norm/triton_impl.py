"""``opgate::rms_norm``: RMSNorm as an opaque torch.library custom op backed by Triton kernels.

Registered with ``custom_op`` + ``register_fake`` + ``register_autograd`` (not
``triton_op``): the op stays opaque to torch.compile/export, so its own kernel is
what runs in compiled graphs, and it works with Triton's CPU interpreter under
compile.  The backward is a custom op too, so the compiled backward graph also
holds an opaque opgate op instead of a decomposition.
"""

from __future__ import annotations

from typing import Any

import torch

from opgate.ops._triton_util import check, check_float, check_same_device
from opgate.ops.rms_norm.launch import rms_backward, rms_forward

OP = "opgate::rms_norm"


def check_inputs(op: str, x: torch.Tensor, w: torch.Tensor) -> None:
    """Shape/dtype/device contract shared by the real and the fake implementation."""
    check_float(op, "x", x)
    check_float(op, "w", w)
    check_same_device(op, {"x": x, "w": w})
    check(x.dim() >= 1, lambda: f"{op}: x must have at least 1 dim, got shape {tuple(x.shape)}")
    check(w.dim() == 1, lambda: f"{op}: w must be 1-d (N,), got shape {tuple(w.shape)}")
    check(
        w.shape[0] == x.shape[-1],
        lambda: f"{op}: w has {w.shape[0]} elements but x's last dim is {x.shape[-1]}",
    )


@torch.library.custom_op(OP, mutates_args=())
def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """y = x / sqrt(mean(x^2, -1) + eps) * w, accumulated in float32 (float64 for float64)."""
    check_inputs(OP, x, w)
    y, _ = rms_forward(OP, x, w, eps)
    return y


@rms_norm.register_fake
def _rms_norm_fake(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    check_inputs(OP, x, w)
    return x.new_empty(x.shape)


@torch.library.custom_op("opgate::rms_norm_backward", mutates_args=())
def rms_norm_backward(
    dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, dw) of rms_norm; dw is a deterministic two-stage reduction over rows."""
    check_inputs(OP, x, w)
    check(dy.shape == x.shape, lambda: f"{OP}: grad shape {tuple(dy.shape)} != x {tuple(x.shape)}")
    dx, dw = rms_backward(OP, dy, x, w, eps)
    return dx, dw


@rms_norm_backward.register_fake
def _rms_norm_backward_fake(
    dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    return x.new_empty(x.shape), w.new_empty(w.shape)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    x, w, eps = inputs
    ctx.save_for_backward(x, w)
    ctx.eps = eps


def _backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:
    x, w = ctx.saved_tensors
    dx, dw = rms_norm_backward(dy, x, w, ctx.eps)
    return dx, dw, None


rms_norm.register_autograd(_backward, setup_context=_setup_context)
