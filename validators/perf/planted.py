"""A planted slowdown: the unchanged op plus one extra pass over part of its input.

The measured-quality study (issue 8) must show that a real ~10% slowdown is
caught.  A fake one (sleeping, or scaling the recorded numbers) would prove
nothing about the timing path, so the slowdown here is device work of the kind
a regression really adds: a Triton kernel that reads a slice of the op's input
``x`` once more, straight from memory, after the op has run.

Sizing: an RMSNorm forward moves ``2 * M * N * itemsize`` bytes (read x,
write y), so re-reading *all* of x would be +50%.  :func:`extra_elements`
picks the slice so that the extra bytes are ``slowdown`` x the op's declared
bytes (20% of x for a 10% slowdown); the study then *measures* the real
slowdown, interleaved against the unchanged op, and reports it.

Why after the op, not fused into a copy of its kernel: the main kernel stays
byte-for-byte the one the A/A runs time, so the only difference between
"unchanged" and "planted" is the extra pass; and because the slice is the
*start* of x, which the op read first, it has left L2 by the time the extra
pass reads it (inputs of the study are several times the L2 size).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import triton
import triton.language as tl

EXTRA_BLOCK = 4096


@triton.jit
def _extra_pass_kernel(x_ptr, sink_ptr, n_elements, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]  # noqa: N803
    """Read BLOCK elements per program and store their sum (so the loads cannot be dropped)."""
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n_elements, other=0.0).to(tl.float32)
    tl.store(sink_ptr + pid, tl.sum(x, axis=0))


def extra_elements(op_bytes: float, numel: int, itemsize: int, slowdown: float) -> int:
    """Elements of x to re-read so that the extra traffic is ``slowdown`` x the op's bytes."""
    if not 0.0 < slowdown <= 10.0:
        raise ValueError(f"slowdown must be in (0, 10], got {slowdown}")
    if op_bytes <= 0 or numel <= 0 or itemsize <= 0:
        raise ValueError(f"need positive bytes, numel and itemsize, got {op_bytes}, {numel}, {itemsize}")
    wanted = math.ceil(slowdown * op_bytes / itemsize)
    if wanted > numel:
        raise ValueError(
            f"a {slowdown:.0%} slowdown needs {wanted} extra elements but x has {numel}: "
            "one pass over x is not enough; pick a smaller slowdown"
        )
    return wanted


def extra_pass(x: torch.Tensor, n_elements: int) -> torch.Tensor:
    """Run the extra pass over the first ``n_elements`` of contiguous ``x``; returns the sink."""
    if not x.is_contiguous():
        raise ValueError("the planted extra pass reads x as a flat buffer: x must be contiguous")
    n = min(n_elements, x.numel())
    programs = max(1, triton.cdiv(n, EXTRA_BLOCK))
    sink = torch.empty(programs, dtype=torch.float32, device=x.device)
    _extra_pass_kernel[(programs,)](x, sink, n, BLOCK=EXTRA_BLOCK, num_warps=8)
    return sink


class Planted:
    """``op(*args, **kwargs)`` followed by the extra pass over ``args[0]``: the slowed-down copy."""

    def __init__(self, op: Callable[..., Any], n_elements: int) -> None:
        self.op = op
        self.n_elements = n_elements

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self.op(*args, **kwargs)
        extra_pass(args[0], self.n_elements)
        return out
