"""``zoo::hang_rms_norm``: planted: never returns (a kernel spinning on a flag that is never set).

The runner's per-cell timeout must kill the worker and record ``error``.
"""

from __future__ import annotations

import time

import torch

from zoo_ops.register import register


def _forward(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    while True:
        time.sleep(0.05)


rms_norm = register("hang_rms_norm", _forward)
