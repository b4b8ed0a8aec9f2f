"""Planted fault: wrong bf16 numbers in the first process that runs a bf16 input, right elsewhere.

The first process to call the op on bfloat16 writes its pid into the marker
file named by ``OPGATE_FX_FLAKY_MARKER`` and returns ``2 * x + 1`` for every
bf16 call it makes; any other process is correct.  So a re-run in the *same*
worker would fail again, and only a re-run in a fresh process passes: the
runner must report ``flaky``.  Without the variable the op is simply correct.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from fx_common import make_op


def _fault(x: torch.Tensor) -> torch.Tensor | None:
    marker = os.environ.get("OPGATE_FX_FLAKY_MARKER")
    if not marker or x.dtype != torch.bfloat16:
        return None
    path = Path(marker)
    if not path.exists():
        path.write_text(str(os.getpid()))
    return x * 2 + 1 if path.read_text() == str(os.getpid()) else None


scale = make_op("opgate_fx::flaky_scale", _fault)
