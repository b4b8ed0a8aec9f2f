"""Device-side (``@triton.jit``) helpers shared by opgate's Triton kernels.

Kept apart from :mod:`ops._triton_util` (host-side planning) so each stays small:
strided tile loads driven by the row plan of :func:`ops._triton_util.collapse_rows`,
rounding that is exact under the CPU interpreter too, a precise 1/sqrt, and the
deterministic second stage of the weight-gradient reductions.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from opgate.ops._triton_util import cdiv, interpreting, needs_rne, next_pow2


@triton.jit
def row_offset(row, R1, R2, s0, s1, s2, NLEAD: tl.constexpr):  # type: ignore[no-untyped-def]  # noqa: PLR0917 (Triton kernels take positional args)
    """Memory offset (int64) of flat row index ``row`` (see :class:`Rows`)."""
    if NLEAD == 1:
        off = row.to(tl.int64) * s0
    elif NLEAD == 2:
        off = (row // R1).to(tl.int64) * s0 + (row % R1).to(tl.int64) * s1
    else:
        i2 = row % R2
        rest = row // R2
        off = (rest // R1).to(tl.int64) * s0 + (rest % R1).to(tl.int64) * s1 + i2.to(tl.int64) * s2
    return off


@triton.jit
def load_tile(ptr, rows, cols, mask, R1, R2, s0, s1, s2, sn, NLEAD: tl.constexpr, ACC: tl.constexpr):  # type: ignore[no-untyped-def]  # noqa: PLR0917 (Triton kernels take positional args)
    """Load a [rows x cols] tile of a strided tensor as ``ACC`` (zeros where masked)."""
    return load_tile_raw(ptr, rows, cols, mask, R1, R2, s0, s1, s2, sn, NLEAD).to(ACC)


@triton.jit
def load_tile_raw(ptr, rows, cols, mask, R1, R2, s0, s1, s2, sn, NLEAD: tl.constexpr):  # type: ignore[no-untyped-def]  # noqa: PLR0917 (Triton kernels take positional args)
    """Load a tile in the tensor's own dtype (prefetched tiles stay narrow in registers)."""
    off = row_offset(rows, R1, R2, s0, s1, s2, NLEAD)
    ptrs = ptr + off[:, None] + cols[None, :].to(tl.int64) * sn
    return tl.load(ptrs, mask=mask, other=0.0)


@triton.jit
def _reduce_partials_kernel(  # type: ignore[no-untyped-def]  # noqa: PLR0917 (Triton kernels take positional args)
    part_ptr, out_ptr, G, N, stride_g, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, RNE: tl.constexpr
):
    """out[n] = sum_g part[g, n] in a fixed order: the deterministic second stage of dw/db."""
    pid = tl.program_id(0)
    cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < N
    acc = tl.zeros([BLOCK_G, BLOCK_N], part_ptr.dtype.element_ty)
    for g0 in range(0, G, BLOCK_G):
        g = g0 + tl.arange(0, BLOCK_G)
        ptrs = part_ptr + g[:, None].to(tl.int64) * stride_g + cols[None, :]
        acc += tl.load(ptrs, mask=(g[:, None] < G) & cmask[None, :], other=0.0)
    tl.store(out_ptr + cols, round_to(tl.sum(acc, axis=0), out_ptr.dtype.element_ty, RNE), mask=cmask)


def reduce_partials(partial: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Sum a (G, N) partial buffer (row stride arbitrary, unit column stride) into ``out`` (N,)."""
    g, n = partial.shape
    # GPU: narrow column blocks so that even N = 4096 spreads over 128 programs
    block_n = min(next_pow2(n), 1024 if interpreting() else (32 if n <= 16384 else 128))
    block_g = min(next_pow2(g), 64 if interpreting() else 32)
    grid = (cdiv(n, block_n),)
    _reduce_partials_kernel[grid](
        partial, out, g, n, partial.stride(0), BLOCK_G=block_g, BLOCK_N=block_n, RNE=needs_rne(out)
    )
    return out


@triton.jit
def round_to(y, dtype: tl.constexpr, RNE: tl.constexpr):  # type: ignore[no-untyped-def]
    """Cast ``y`` to ``dtype`` with round-to-nearest-even.

    Why: Triton's CPU interpreter converts float32 -> bfloat16 by truncation,
    which doubles the rounding error and would fail the tolerance rule on CPU
    only.  With ``RNE`` (set only under the interpreter for bfloat16 outputs) the
    value is rounded in integer arithmetic first, so the final cast is exact.
    On the GPU ``RNE`` is False and the hardware conversion (already RNE) is used.
    """
    if RNE:
        u = y.to(tl.float32).to(tl.uint32, bitcast=True)
        u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
        y = u.to(tl.float32, bitcast=True)
    return y.to(dtype)


@triton.jit
def inv_sqrt(v, ACC: tl.constexpr):  # type: ignore[no-untyped-def]
    """1 / sqrt(v) with a correctly rounded square root.

    ``tl.sqrt`` is the fast approximation in float32; its few-ulp error in rstd is
    shared by every element of a row and adds up coherently in dw, which then
    misses the float32 tolerance (seen on the H200).  float64 sqrt is always exact.
    """
    if ACC == tl.float64:  # noqa: SIM108, SIM300 (a constexpr branch, resolved at compile time)
        r = 1.0 / tl.sqrt(v)
    else:
        r = 1.0 / tl.sqrt_rn(v)
    return r
