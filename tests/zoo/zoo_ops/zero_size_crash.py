"""``zoo::zero_size_crash_rms_norm``: planted: an empty batch divides by zero in the launcher.

The launcher sizes its tiles from ``numel // rows`` before checking for an
empty input, so a leading dimension of 0 raises ZeroDivisionError.
"""

from __future__ import annotations

import torch

from zoo_ops.kernels import launch
from zoo_ops.register import register


def _forward(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    row_len = x.numel() // x.shape[0]
    return launch(x, w, eps, block_n=min(1024, 1 << (row_len - 1).bit_length()))


rms_norm = register("zero_size_crash_rms_norm", _forward)
