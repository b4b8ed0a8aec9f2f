"""``opgate::rope``: rotary embedding of q and k in one Triton launch, any strides, both layouts.

Rows are (batch, position, head) triples; each program rotates a block of rows
of q or of k (grouped-query k may have fewer heads) and gathers the matching
cos/sin entries (tiny tables, served from cache).  The layout string only decides
which stride is the head stride and
which the sequence stride, so (B, S, H, D) and (B, H, S, D) share the kernel.
The backward is the exact transpose (for the usual tables, whose two halves
are equal, that is rope with -sin).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

from opgate.ops import _replay as replay
from opgate.ops._replay.formula import Formula
from opgate.ops._triton_device import round_to
from opgate.ops._triton_util import (
    acc_dtype,
    build_signature,
    cdiv,
    check,
    check_float,
    check_same_device,
    interpreting,
    needs_rne,
    next_pow2,
)

OP = "opgate::rope"
LAYOUTS = ("bshd", "bhsd")


@triton.jit
def _rope_part(  # type: ignore[no-untyped-def]  # noqa: PLR0917 (Triton kernels take positional args)
    x_ptr, o_ptr, cos_ptr, sin_ptr, blk, n_rows, S, H, HALF,
    xb, xs, xh, xd, ob, os, oh, od, cb, cs, cd, nb, ns, nd,
    BACKWARD: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_HALF: tl.constexpr,
    ACC: tl.constexpr, RNE: tl.constexpr,
):  # fmt: skip
    """Rotate BLOCK_R (batch, position, head) rows of one tensor; row r = (b * S + s) * H + h."""
    r = blk * BLOCK_R + tl.arange(0, BLOCK_R)
    h = r % H
    t = r // H
    s = (t % S).to(tl.int64)
    b = (t // S).to(tl.int64)
    h = h.to(tl.int64)
    d = tl.arange(0, BLOCK_HALF).to(tl.int64)
    mask = (r < n_rows)[:, None] & (d < HALF)[None, :]
    cbase = (b * cb + s * cs)[:, None]
    nbase = (b * nb + s * ns)[:, None]
    c1 = tl.load(cos_ptr + cbase + d[None, :] * cd, mask=mask, other=0.0).to(ACC)
    c2 = tl.load(cos_ptr + cbase + (d + HALF)[None, :] * cd, mask=mask, other=0.0).to(ACC)
    s1 = tl.load(sin_ptr + nbase + d[None, :] * nd, mask=mask, other=0.0).to(ACC)
    s2 = tl.load(sin_ptr + nbase + (d + HALF)[None, :] * nd, mask=mask, other=0.0).to(ACC)
    xbase = (b * xb + s * xs + h * xh)[:, None]
    x1 = tl.load(x_ptr + xbase + d[None, :] * xd, mask=mask, other=0.0).to(ACC)
    x2 = tl.load(x_ptr + xbase + (d + HALF)[None, :] * xd, mask=mask, other=0.0).to(ACC)
    if BACKWARD:
        y1 = x1 * c1 + x2 * s2
        y2 = x2 * c2 - x1 * s1
    else:
        y1 = x1 * c1 - x2 * s1
        y2 = x2 * c2 + x1 * s2
    obase = (b * ob + s * os + h * oh)[:, None]
    tl.store(o_ptr + obase + d[None, :] * od, round_to(y1, o_ptr.dtype.element_ty, RNE), mask=mask)
    tl.store(o_ptr + obase + (d + HALF)[None, :] * od, round_to(y2, o_ptr.dtype.element_ty, RNE), mask=mask)


@triton.jit
def _rope_kernel(  # type: ignore[no-untyped-def]  # noqa: PLR0917 (Triton kernels take positional args)
    q_ptr, k_ptr, cos_ptr, sin_ptr, qo_ptr, ko_ptr, S, HQ, HK, HALF, NQ, NK, q_blocks,
    qb, qs, qh, qd, kb, ks, kh, kd, cb, cs, cd, nb, ns, nd,
    qob, qos, qoh, qod, kob, kos, koh, kod,
    BACKWARD: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_HALF: tl.constexpr,
    ACC: tl.constexpr, RNE: tl.constexpr,
):  # fmt: skip
    """One launch for q and k: the first ``q_blocks`` programs take q's rows, the rest k's."""
    pid = tl.program_id(0)
    if pid < q_blocks:
        _rope_part(
            q_ptr, qo_ptr, cos_ptr, sin_ptr, pid, NQ, S, HQ, HALF, qb, qs, qh, qd, qob, qos, qoh, qod,
            cb, cs, cd, nb, ns, nd, BACKWARD, BLOCK_R, BLOCK_HALF, ACC, RNE,
        )  # fmt: skip
    else:
        _rope_part(
            k_ptr, ko_ptr, cos_ptr, sin_ptr, pid - q_blocks, NK, S, HK, HALF,
            kb, ks, kh, kd, kob, kos, koh, kod,
            cb, cs, cd, nb, ns, nd, BACKWARD, BLOCK_R, BLOCK_HALF, ACC, RNE,
        )  # fmt: skip


#: What the build check compiles for sm_80 / sm_90 (see validators/checks/triton_build.py).
TRITON_BUILD_SIGNATURES = {
    "_rope_kernel": build_signature(
        _rope_kernel,
        {"BACKWARD": False, "BLOCK_R": 32, "BLOCK_HALF": 64, "ACC": "fp32", "RNE": False},
        pointers={"cos_ptr": "{dtype}", "sin_ptr": "{dtype}"},
        num_warps=4,
    ),
}


def _bshd_strides(t: torch.Tensor, layout: str) -> tuple[int, int, int, int]:
    """(batch, seq, head, dim) strides whatever the physical dim order."""
    sb, s1, s2, sd = t.stride()
    return (sb, s1, s2, sd) if layout == "bshd" else (sb, s2, s1, sd)


def _table_strides(t: torch.Tensor) -> tuple[int, int, int]:
    return (0, t.stride(0), t.stride(1)) if t.dim() == 2 else (t.stride(0), t.stride(1), t.stride(2))


def _launch(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str, *, backward: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    qo = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    ko = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    bsz, seq = q.shape[0], q.shape[1 if layout == "bshd" else 2]
    hq, hk = q.shape[2 if layout == "bshd" else 1], k.shape[2 if layout == "bshd" else 1]
    if bsz * seq == 0 or (qo.numel() == 0 and ko.numel() == 0):
        return qo, ko
    half = q.shape[-1] // 2
    block_half = next_pow2(half)
    nq, nk = bsz * seq * hq, bsz * seq * hk
    target = 16384 if interpreting() else 2048
    block_r = max(1, min(target // block_half, next_pow2(max(nq, nk))))
    q_blocks = cdiv(nq, block_r)
    warps = next_pow2(max(1, min(8, block_r * block_half // 512)))
    grid = (q_blocks + cdiv(nk, block_r),)
    _rope_kernel[grid](
        q, k, cos, sin, qo, ko, seq, hq, hk, half, nq, nk, q_blocks,
        *_bshd_strides(q, layout), *_bshd_strides(k, layout), *_table_strides(cos), *_table_strides(sin),
        *_bshd_strides(qo, layout), *_bshd_strides(ko, layout),
        BACKWARD=backward, BLOCK_R=block_r, BLOCK_HALF=block_half,
        ACC=acc_dtype(q.dtype, k.dtype, cos.dtype, sin.dtype), RNE=needs_rne(qo, ko), num_warps=warps,
    )  # fmt: skip
    return qo, ko


def _shape_message(expected: str, t: torch.Tensor) -> Callable[[], str]:
    return lambda: f"{OP}: {expected}, got {tuple(t.shape)}"


def _check(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> None:
    check(layout in LAYOUTS, lambda: f"{OP}: layout must be one of {LAYOUTS}, got {layout!r}")
    for name, t in (("q", q), ("k", k), ("cos", cos), ("sin", sin)):
        check_float(OP, name, t)
    check_same_device(OP, {"q": q, "k": k, "cos": cos, "sin": sin})
    check(q.dim() == 4 and k.dim() == 4, lambda: f"{OP}: q and k must be 4-d ({layout})")
    seq_dim = 1 if layout == "bshd" else 2
    b, s, d = q.shape[0], q.shape[seq_dim], q.shape[3]
    check(d % 2 == 0, lambda: f"{OP}: head dim must be even for rotate-half, got {d}")
    check(
        k.shape[0] == b and k.shape[seq_dim] == s and k.shape[3] == d,
        lambda: f"{OP}: k shape {tuple(k.shape)} does not match q {tuple(q.shape)} in batch/seq/head dim",
    )
    for name, t in (("cos", cos), ("sin", sin)):
        check(
            t.dim() in (2, 3) and t.shape[-2] == s and t.shape[-1] == d and (t.dim() == 2 or t.shape[0] == b),
            _shape_message(f"{name} must be (S, D) or (B, S, D) = ({s}, {d}) / ({b}, {s}, {d})", t),
        )


def _rope(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str = "bshd"
) -> tuple[torch.Tensor, torch.Tensor]:
    """(q * cos + rotate_half(q) * sin, same for k), contiguous in q's/k's layout."""
    _check(q, k, cos, sin, layout)
    return _launch(q, k, cos, sin, layout, backward=False)


rope = torch.library.custom_op(OP, mutates_args=())(_rope)


@rope.register_fake
def _fake(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str = "bshd"
) -> tuple[torch.Tensor, torch.Tensor]:
    _check(q, k, cos, sin, layout)
    return q.new_empty(q.shape), k.new_empty(k.shape)


def _rope_backward(
    gq: torch.Tensor, gk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dq, dk): the transpose of the rotation, applied to the output gradients."""
    _check(gq, gk, cos, sin, layout)
    return _launch(gq, gk, cos, sin, layout, backward=True)


rope_backward = torch.library.custom_op("opgate::rope_backward", mutates_args=())(_rope_backward)


@rope_backward.register_fake
def _backward_fake(
    gq: torch.Tensor, gk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str
) -> tuple[torch.Tensor, torch.Tensor]:
    return gq.new_empty(gq.shape), gk.new_empty(gk.shape)


_NO_TABLE_GRAD = f"{OP}: gradients with respect to cos/sin are not supported"
#: backward(gq, gk, cos, sin, layout) -> (dq, dk)
FORMULA = Formula(
    "opgate::rope_backward",
    (("grad", 0), ("grad", 1), ("input", 2), ("input", 3), ("input", 4)),
    (0, 1, None, None, None),
    unsupported={2: _NO_TABLE_GRAD, 3: _NO_TABLE_GRAD},
)
FORMULA.register(rope)
replay.attach(OP, _rope, FORMULA)
replay.attach(FORMULA.backward, _rope_backward)
