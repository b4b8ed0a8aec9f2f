"""``zoo::good_rms_norm``: the control. Nothing planted; it must pass every cell."""

from __future__ import annotations

import torch

from zoo_ops.kernels import launch
from zoo_ops.register import register


def _forward(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return launch(x, w, eps)


rms_norm = register("good_rms_norm", _forward)
