"""``zoo::hidden_copy_rms_norm``: planted: ``x.contiguous()`` before the launch.

Numbers stay right; every non-contiguous input pays an extra full read+write
(the Liger RMSNorm behaviour measured on the H200).  Contiguous, offset,
misaligned and zero-size inputs are already contiguous: no copy there.
"""

from __future__ import annotations

import torch

from zoo_ops.kernels import launch
from zoo_ops.register import register


def _forward(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return launch(x.contiguous(), w, eps)


rms_norm = register("hidden_copy_rms_norm", _forward)
