"""``zoo::specializes_rms_norm``: planted: the fake impl turns a symbolic size into a Python int.

``int(x.shape[1])`` in the fake forces Dynamo to specialize the compiled graph
on N, so a second shape recompiles although the spec declares dynamic shapes.
Eager is unaffected.
"""

from __future__ import annotations

import torch

from zoo_ops.kernels import launch
from zoo_ops.register import register


def _forward(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return launch(x, w, eps)


rms_norm = register("specializes_rms_norm", _forward, fake=False)


@rms_norm.register_fake
def _fake(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    n = int(x.shape[1])
    return x.new_empty((x.shape[0], n))
