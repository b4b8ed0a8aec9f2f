"""``zoo::tail_unwritten_rms_norm``: planted: the grid rounds down (``M // BLOCK_M`` programs).

With 4 rows per program, the last ``M % 4`` rows of the output are never
written: whatever the allocator left there is returned.  Only poisoned output
buffers make that reliably visible (fresh memory is often zero, sometimes a
stale copy of a previous result).  Shapes whose M is a multiple of 4 pass.
"""

from __future__ import annotations

import torch

from zoo_ops.kernels import launch
from zoo_ops.register import register

ROWS_PER_PROGRAM = 4


def _forward(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return launch(x, w, eps, block_m=ROWS_PER_PROGRAM, floor_grid=True)


rms_norm = register("tail_unwritten_rms_norm", _forward)
