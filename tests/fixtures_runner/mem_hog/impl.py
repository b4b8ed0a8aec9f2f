"""Planted fault: on float16 inputs the kernel allocates (and touches) memory without bound.

It stops by itself at :data:`CAP` and then returns wrong numbers, so a run
whose memory limit did not hold shows a ``fail`` (and never takes the host
down) instead of the ``error`` naming the limit that the tests expect.
"""

from __future__ import annotations

import torch
from fx_common import make_op

CHUNK = 64 << 20
CAP = 3 << 30


def _fault(x: torch.Tensor) -> torch.Tensor | None:
    if x.dtype != torch.float16:
        return None
    hoard = []
    while len(hoard) * CHUNK < CAP:
        hoard.append(torch.ones(CHUNK, dtype=torch.uint8))  # touched: real memory, not a reservation
    return x * 3


scale = make_op("opgate_fx::mem_hog_scale", _fault)
