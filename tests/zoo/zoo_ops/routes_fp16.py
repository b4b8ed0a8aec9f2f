"""``zoo::routes_fp16_rms_norm``: planted: float16 inputs are silently handed to aten's RMSNorm.

The numbers are right (aten is a fine RMSNorm), but the op's kernel never runs
for fp16: the profiler shows ``aten::rms_norm`` (CPU) or aten's layer-norm
kernel (CUDA) instead.  fp32/bf16 take the Triton kernel.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from zoo_ops.kernels import launch
from zoo_ops.register import register


def _forward(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    if x.dtype == torch.float16:
        y = x.new_empty(x.shape)
        return y.copy_(F.rms_norm(x, (x.shape[-1],), w, eps))
    return launch(x, w, eps)


rms_norm = register("routes_fp16_rms_norm", _forward)
