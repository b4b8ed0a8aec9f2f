"""Planted fault: on float16 GPU inputs a Triton kernel stores far outside any allocation.

The GPU reports an illegal memory access; the CUDA context is then lost for
good (a *sticky* error: every later call in the process fails).  The worker
must be retired after this cell and the next cell must get a fresh one: the
cell is ``error``, every other cell passes.  On the CPU, and in other dtypes,
the op is correct.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from fx_common import make_op


@triton.jit
def _wild_store(ptr):  # type: ignore[no-untyped-def]
    tl.store(ptr + (1 << 40), 1.0)


def _fault(x: torch.Tensor) -> None:
    if x.dtype == torch.float16 and x.is_cuda:
        _wild_store[(1,)](x)
        torch.cuda.synchronize()  # raises: an illegal memory access was encountered


scale = make_op("opgate_fx::sticky_scale", _fault)
