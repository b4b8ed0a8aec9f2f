"""``opgate::fused_add_rms_norm``: residual add + RMSNorm in one pass, returning (y, new_residual).

One kernel reads x and residual once and writes both the new residual and the
normalized output (the unfused pair reads the sum back).  The backward kernel
adds the new residual's own gradient into dx; x and residual get that same
gradient, returned once for both as aten's add does (autograd copies it only
where two leaves would otherwise share one .grad buffer).
"""

from __future__ import annotations

import torch

from opgate.ops import _replay as replay
from opgate.ops._replay.formula import Formula
from opgate.ops._triton_util import check, check_float, check_same_device
from opgate.ops.fused_add_rms_norm import triton_kernels as K
from opgate.ops.rms_norm.launch import rms_backward, rms_forward
from opgate.ops.rms_norm.triton_impl import check_inputs

OP = "opgate::fused_add_rms_norm"


def _check(x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor) -> None:
    check_inputs(OP, x, w)
    check_float(OP, "residual", residual)
    check_same_device(OP, {"x": x, "residual": residual})
    check(
        residual.shape == x.shape,
        lambda: f"{OP}: residual shape {tuple(residual.shape)} != x shape {tuple(x.shape)}",
    )
    check(residual.dtype == x.dtype, lambda: f"{OP}: residual dtype {residual.dtype} != x dtype {x.dtype}")


def _fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual, w, eps), x + residual), the sum rounded to x's dtype first."""
    _check(x, residual, w)
    y, h = rms_forward(OP, x, w, eps, residual=residual, fused_kernel=K._fused_add_rms_norm_fwd_kernel)
    assert h is not None
    return y, h


fused_add_rms_norm = torch.library.custom_op(OP, mutates_args=())(_fused_add_rms_norm)


@fused_add_rms_norm.register_fake
def _fake(
    x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    _check(x, residual, w)
    return x.new_empty(x.shape), x.new_empty(x.shape)


def _fused_add_rms_norm_backward(
    gy: torch.Tensor, gh: torch.Tensor | None, h: torch.Tensor, w: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dh, dw): dh is the gradient of both x and residual."""
    check_inputs(OP, h, w)
    return rms_backward(OP, gy, h, w, eps, gh=gh, fused_kernel=K._fused_add_rms_norm_bwd_kernel)


fused_add_rms_norm_backward = torch.library.custom_op("opgate::fused_add_rms_norm_backward", mutates_args=())(
    _fused_add_rms_norm_backward
)


@fused_add_rms_norm_backward.register_fake
def _backward_fake(
    gy: torch.Tensor, gh: torch.Tensor | None, h: torch.Tensor, w: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    return h.new_empty(h.shape), w.new_empty(w.shape)


#: backward(gy, gh, h, w, eps) -> (dh, dw); dh is the gradient of both x and residual
FORMULA = Formula(
    "opgate::fused_add_rms_norm_backward",
    (("grad", 0), ("grad", 1), ("output", 1), ("input", 2), ("input", 3)),
    (0, 0, 1, None),
)
FORMULA.register(fused_add_rms_norm)
replay.attach(OP, _fused_add_rms_norm, FORMULA)
replay.attach(FORMULA.backward, _fused_add_rms_norm_backward)
