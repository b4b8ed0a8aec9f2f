"""``zoo::ignores_strides_rms_norm``: planted: the launcher assumes row-major x (strides N, 1).

Right for contiguous inputs, including offset/misaligned ones (the data
pointer carries the offset); wrong for transposed, strided and broadcast views.
"""

from __future__ import annotations

import torch

from zoo_ops.kernels import launch
from zoo_ops.register import register


def _forward(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return launch(x, w, eps, strides=(x.shape[1], 1))


rms_norm = register("ignores_strides_rms_norm", _forward)
