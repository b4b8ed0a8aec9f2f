"""``zoo::wrong_backward_rms_norm``: planted: the backward forgets that rstd depends on x.

Forward is the correct kernel; dx = g * w * rstd drops the projection term
``- x * rstd^3 * mean(g * w * x)``.  Only gradient checks can see it.
"""

from __future__ import annotations

import functools

import torch

from zoo_ops.kernels import launch
from zoo_ops.register import register, rms_backward


def _forward(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return launch(x, w, eps)


rms_norm = register(
    "wrong_backward_rms_norm", _forward, backward=functools.partial(rms_backward, drop_projection=True)
)
