"""``zoo::bf16_accum_rms_norm``: planted: the sum of squares accumulates in bfloat16 for bf16 inputs.

The row is walked in chunks of ``CHUNK`` columns and the running sum is kept
in the input dtype when that is bf16, converted with the cheap truncating cast.
Every chunk then loses up to one bf16 ulp of the running sum, always
downwards: on wide rows (4096 columns, 64 chunks) the mean square comes out a
few percent low and every output a few percent high, far beyond bf16 output
rounding.  fp32/fp16 inputs accumulate in float32 and are right; a row of one
chunk (the ``small`` shape set) never accumulates and passes.
"""

from __future__ import annotations

import torch
import triton.language as tl

from zoo_ops.kernels import launch
from zoo_ops.register import register

CHUNK = 64


def _forward(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    acc = tl.bfloat16 if x.dtype == torch.bfloat16 else None
    return launch(x, w, eps, acc=acc, truncate_acc=acc is not None, block_n=CHUNK)


rms_norm = register("bf16_accum_rms_norm", _forward)
