"""``zoo::fake_dtype_rms_norm``: planted: the fake impl says float32 for every output.

The kernel returns the input's dtype, so the fake lies for bf16/fp16 inputs
(fp32 is the truth).  Compiled or exported alone the lie is invisible: the
real bf16 output flows straight back.  Inside a graph a consumer is generated
for a float32 buffer and reads bf16 memory as float32.  The fake_meta check
names the output and the two dtypes.
"""

from __future__ import annotations

import torch

from zoo_ops.kernels import launch
from zoo_ops.register import register


def _forward(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return launch(x, w, eps)


def _lying_fake(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x.new_empty(x.shape, dtype=torch.float32)


rms_norm = register("fake_dtype_rms_norm", _forward, fake_impl=_lying_fake)
