"""``zoo::ignores_offset_rms_norm``: planted: x is addressed from its storage's base pointer.

The launcher rebuilds x over ``x.untyped_storage()`` with x's sizes and
strides but storage offset 0, as code that takes ``storage().data_ptr()``
does.  Right whenever x starts at its storage (contiguous, transposed,
strided, broadcast); wrong for the offset and misaligned layouts.
"""

from __future__ import annotations

import torch

from zoo_ops.kernels import launch
from zoo_ops.register import register


def _forward(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    base = x.new_empty(0).set_(x.untyped_storage(), 0, x.shape, x.stride())
    return launch(x, w, eps, base=base)


rms_norm = register("ignores_offset_rms_norm", _forward)
