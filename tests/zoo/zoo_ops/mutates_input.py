"""``zoo::mutates_input_rms_norm``: planted: the forward also normalises ``x`` in place.

It returns a correct, fresh ``y``, then runs the same kernel once more with
``x`` as its output, as an in-place variant would (Liger's RoPE writes its
result into ``q`` and ``k``).  The op is registered functional
(``mutates_args=()``): a caller that reads ``x`` again, or autograd, which
saved ``x`` for the backward, sees the normalised values.  The numbers the op
returns are right; only the mutation check names what is wrong.
"""

from __future__ import annotations

import torch

from zoo_ops.kernels import launch
from zoo_ops.register import register


def _forward(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    y = launch(x, w, eps)
    launch(x, w, eps, out=x)
    return y


rms_norm = register("mutates_input_rms_norm", _forward)
