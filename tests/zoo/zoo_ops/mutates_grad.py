"""``zoo::mutates_grad_rms_norm``: planted: the backward writes ``dx`` into the incoming gradient.

Forward and gradients are correct; the backward stores ``dx`` in the buffer
of ``grad_output`` and returns it, to save an allocation (what Liger's RMSNorm
does by default and its RoPE always does).  A caller that reuses the upstream
gradient (gradient accumulation over a shared ``grad_output``, a second
backward, gradcheck's reentrancy test) gets ``dx`` instead.
"""

from __future__ import annotations

import torch

from zoo_ops.kernels import launch
from zoo_ops.register import register, rms_backward


def _forward(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return launch(x, w, eps)


def _backward(
    g: torch.Tensor, x: torch.Tensor, w: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    dx, dw = rms_backward(g, x, w, eps)
    g.copy_(dx)
    return g, dw


rms_norm = register("mutates_grad_rms_norm", _forward, backward=_backward)
