"""``zoo::fake_strides_rms_norm``: planted: the fake impl keeps the input's strides, the kernel does not.

``torch.empty_like(x)`` is the usual fake; the kernel's launcher allocates a
contiguous output.  On a transposed input the fake promises a transposed
output and the kernel returns a row-major one: a consumer Inductor generates
from the fake reads the elements in the wrong order.  Every other layout
agrees (``empty_like`` of a non-dense view is contiguous too).
"""

from __future__ import annotations

import torch

from zoo_ops.kernels import launch
from zoo_ops.register import register


def _forward(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return launch(x, w, eps)


def _lying_fake(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return torch.empty_like(x)


rms_norm = register("fake_strides_rms_norm", _forward, fake_impl=_lying_fake)
