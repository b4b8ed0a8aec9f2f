"""A tiny Triton kernel a GPU worker launches before its first cell (see ``worker.warm_cuda``).

A fresh process pays Triton's first launch once: the driver's utilities and
the launcher loaded, the cubin read from the cache.  Measured on the H200, a
fresh worker's first cudagraphs cell spent 0.5 s more in its first check
(``fake_meta``, the first to run the op) than the next cell did, and 0.03 s
when this kernel had run first.  Paid at start-up instead, it is hidden
behind the previous cell for the spare workers the pool starts ahead of the
cells that need a fresh one (CUDA graphs, AOTI, re-runs).  It touches only
its own 16-element tensor.
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl


@triton.jit  # type: ignore[misc, untyped-decorator, unused-ignore]
def _add_one(x_ptr: Any, n: Any, block: tl.constexpr) -> None:
    offs = tl.program_id(0) * block + tl.arange(0, block)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


def launch(torch: Any) -> None:
    """Launch the kernel once on the current CUDA device and wait for it."""
    x = torch.zeros(16, device="cuda")
    _add_one[(1,)](x, 16, block=16)
    torch.cuda.synchronize()
    if int(x.sum().item()) != 16:
        raise RuntimeError("the Triton warm-up kernel returned wrong numbers")
