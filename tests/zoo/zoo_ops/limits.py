"""``zoo::limits_*``: three implementations that all *declare* float16 unsupported.

* ``refuses``: raises a clear NotImplementedError for fp16 (the declaration holds);
* ``works``: computes fp16 correctly anyway (the declaration is stale);
* ``wrong``: returns garbage for fp16 without raising (the worst case).
"""

from __future__ import annotations

import torch

from zoo_ops.kernels import launch
from zoo_ops.register import register


def _refuses(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    if x.dtype == torch.float16:
        raise NotImplementedError("zoo::limits_refuses: float16 is not implemented (use bfloat16)")
    return launch(x, w, eps)


def _works(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return launch(x, w, eps)


def _wrong(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    if x.dtype == torch.float16:
        return (x * w).contiguous()
    return launch(x, w, eps)


refuses = register("limits_refuses", _refuses)
works = register("limits_works", _works)
wrong = register("limits_wrong", _wrong)
