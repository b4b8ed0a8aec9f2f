"""``zoo::graph_vanish_rms_norm``: planted: while a CUDA graph is being captured, the op calls aten.

A guard written for a kernel that cannot be captured (or a library that
skips its fast path during capture): the numbers stay right and every eager
and compiled call runs the Triton kernel, but the graph that
``mode="reduce-overhead"`` captures holds aten's RMSNorm, so every replay runs
that.  Only the kernels of the replayed graph show it (GPU cudagraphs cells).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from zoo_ops.kernels import launch
from zoo_ops.register import register


def _forward(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    if x.is_cuda and torch.cuda.is_current_stream_capturing():
        y = x.new_empty(x.shape)
        return y.copy_(F.rms_norm(x, (x.shape[-1],), w, eps))
    return launch(x, w, eps)


rms_norm = register("graph_vanish_rms_norm", _forward)
