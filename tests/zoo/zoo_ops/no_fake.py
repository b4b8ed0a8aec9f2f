"""``zoo::no_fake_rms_norm``: planted: no fake (meta) implementation registered.

Eager works; torch.compile cannot propagate shapes through the op, so
fullgraph compile fails, and opcheck's test_faketensor / test_aot_dispatch_dynamic fail.
"""

from __future__ import annotations

import torch

from zoo_ops.kernels import launch
from zoo_ops.register import register


def _forward(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return launch(x, w, eps)


rms_norm = register("no_fake_rms_norm", _forward, fake=False)
