"""``opgate::rms_norm``: RMSNorm as an opaque torch.library custom op backed by Triton kernels.

Registered with ``custom_op`` + ``register_fake`` + an autograd :class:`Formula` (not
``triton_op``): the op stays opaque to torch.compile/export, so its own kernel is
what runs in compiled graphs, and it works with Triton's CPU interpreter under
compile.  The backward is a custom op too, so the compiled backward graph also
holds an opaque opgate op instead of a decomposition.  On a GPU the op is also
served by the launch-replay C++ path (:mod:`opgate.ops._replay`): the same
kernels, without Python per call.
"""

from __future__ import annotations

import torch

from opgate.ops import _replay as replay
from opgate.ops._replay.formula import Formula
from opgate.ops._triton_util import check, check_float, check_same_device
from opgate.ops.rms_norm.launch import rms_backward, rms_forward

OP = "opgate::rms_norm"
BACKWARD = "opgate::rms_norm_backward"


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


def _rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """y = x / sqrt(mean(x^2, -1) + eps) * w, accumulated in float32 (float64 for float64)."""
    check_inputs(OP, x, w)
    y, _ = rms_forward(OP, x, w, eps)
    return y


def _rms_norm_backward(
    dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, dw) of rms_norm; dw is a deterministic two-stage reduction over rows."""
    check_inputs(OP, x, w)
    check(dy.shape == x.shape, lambda: f"{OP}: grad shape {tuple(dy.shape)} != x {tuple(x.shape)}")
    dx, dw = rms_backward(OP, dy, x, w, eps)
    return dx, dw


rms_norm = torch.library.custom_op(OP, mutates_args=())(_rms_norm)
rms_norm_backward = torch.library.custom_op(BACKWARD, mutates_args=())(_rms_norm_backward)


@rms_norm.register_fake
def _rms_norm_fake(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    check_inputs(OP, x, w)
    return x.new_empty(x.shape)


@rms_norm_backward.register_fake
def _rms_norm_backward_fake(
    dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    return x.new_empty(x.shape), w.new_empty(w.shape)


#: backward(dy, x, w, eps) -> (dx, dw)
FORMULA = Formula(BACKWARD, (("grad", 0), ("input", 0), ("input", 1), ("input", 2)), (0, 1, None))
FORMULA.register(rms_norm)
replay.attach(OP, _rms_norm, FORMULA)
replay.attach(BACKWARD, _rms_norm_backward)
