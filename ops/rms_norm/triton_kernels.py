"""Triton kernels for RMSNorm and residual-add + RMSNorm (shared bodies, op-specific names).

Why one file for two ops: ``fused_add_rms_norm`` is RMSNorm with a residual add
in front, and its backward is RMSNorm's plus the residual gradient.  The bodies
are ``@triton.jit`` helpers with constexpr switches; each op launches its own
thin kernel so the profiler (the evidence check) names the op that really ran.

Layout contract: inputs are read through (s0, s1, s2, sn) strides from
:func:`ops._triton_util.collapse_rows`; outputs are freshly allocated and
contiguous, so their offset is ``row * N + col``.  Math is in ``ACC`` (float32,
or float64 for float64 inputs); every store rounds once to the output dtype.
"""

from __future__ import annotations

import triton
import triton.language as tl

from opgate.ops._triton_device import inv_sqrt, load_tile, load_tile_raw, round_to
from opgate.ops._triton_util import build_signature


@triton.jit
def _rms_fwd_body(  # type: ignore[no-untyped-def]  # noqa: PLR0917 (Triton kernels take positional args)
    x_ptr, r_ptr, h_ptr, w_ptr, y_ptr, n_rows, N, R1, R2,
    xs0, xs1, xs2, xsn, rs0, rs1, rs2, rsn, wsn, eps,
    NLEAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CHUNKED: tl.constexpr, HAS_RES: tl.constexpr, ACC: tl.constexpr, RNE: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < n_rows
    out_row = rows.to(tl.int64) * N
    if not CHUNKED:
        cols = tl.arange(0, BLOCK_N)
        cmask = cols < N
        mask = rmask[:, None] & cmask[None, :]
        x = load_tile(x_ptr, rows, cols, mask, R1, R2, xs0, xs1, xs2, xsn, NLEAD, ACC)
        if HAS_RES:
            r = load_tile(r_ptr, rows, cols, mask, R1, R2, rs0, rs1, rs2, rsn, NLEAD, ACC)
            h = round_to(x + r, h_ptr.dtype.element_ty, RNE)
            tl.store(h_ptr + out_row[:, None] + cols[None, :], h, mask=mask)
            x = h.to(ACC)
        rstd = inv_sqrt(tl.sum(x * x, axis=1) / N + eps, ACC)
        w = tl.load(w_ptr + cols * wsn, mask=cmask, other=0.0).to(ACC)
        y = x * rstd[:, None] * w[None, :]
        tl.store(
            y_ptr + out_row[:, None] + cols[None, :], round_to(y, y_ptr.dtype.element_ty, RNE), mask=mask
        )
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], ACC)
        for start in range(0, N, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = rmask[:, None] & (cols < N)[None, :]
            x = load_tile(x_ptr, rows, cols, mask, R1, R2, xs0, xs1, xs2, xsn, NLEAD, ACC)
            if HAS_RES:
                r = load_tile(r_ptr, rows, cols, mask, R1, R2, rs0, rs1, rs2, rsn, NLEAD, ACC)
                h = round_to(x + r, h_ptr.dtype.element_ty, RNE)
                tl.store(h_ptr + out_row[:, None] + cols[None, :], h, mask=mask)
                x = h.to(ACC)
            acc += x * x
        rstd = inv_sqrt(tl.sum(acc, axis=1) / N + eps, ACC)
        for start in range(0, N, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            cmask = cols < N
            mask = rmask[:, None] & cmask[None, :]
            if HAS_RES:  # re-read the rounded residual just written (this program's own rows)
                x = tl.load(h_ptr + out_row[:, None] + cols[None, :], mask=mask, other=0.0).to(ACC)
            else:
                x = load_tile(x_ptr, rows, cols, mask, R1, R2, xs0, xs1, xs2, xsn, NLEAD, ACC)
            w = tl.load(w_ptr + cols * wsn, mask=cmask, other=0.0).to(ACC)
            y = x * rstd[:, None] * w[None, :]
            tl.store(
                y_ptr + out_row[:, None] + cols[None, :], round_to(y, y_ptr.dtype.element_ty, RNE), mask=mask
            )


@triton.jit
def _rms_norm_fwd_kernel(  # type: ignore[no-untyped-def]  # noqa: PLR0917 (Triton kernels take positional args)
    x_ptr, w_ptr, y_ptr, n_rows, N, R1, R2, xs0, xs1, xs2, xsn, wsn, eps,
    NLEAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CHUNKED: tl.constexpr, ACC: tl.constexpr, RNE: tl.constexpr,
):  # fmt: skip
    _rms_fwd_body(
        x_ptr, x_ptr, y_ptr, w_ptr, y_ptr, n_rows, N, R1, R2,
        xs0, xs1, xs2, xsn, xs0, xs1, xs2, xsn, wsn, eps,
        NLEAD, BLOCK_M, BLOCK_N, CHUNKED, False, ACC, RNE,
    )  # fmt: skip


@triton.jit
def _rms_bwd_body(  # type: ignore[no-untyped-def]  # noqa: PLR0917 (Triton kernels take positional args)
    x_ptr, w_ptr, dy_ptr, gh_ptr, dx_ptr, part_ptr, n_rows, N, R1, R2,
    xs0, xs1, xs2, xsn, ds0, ds1, ds2, dsn, gs0, gs1, gs2, gsn, wsn, eps, n_progs,
    NLEAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_GH: tl.constexpr, PREFETCH: tl.constexpr, ACC: tl.constexpr, RNE: tl.constexpr,
):  # fmt: skip
    """Persistent backward for rows that fit in registers: dx per row, dw partial per program.

    dx = rstd * (dy*w - xhat * mean(xhat * dy*w)), xhat = x * rstd (rstd recomputed:
    x is read anyway, so saving it would only add traffic).  Program ``pid`` walks
    row blocks pid, pid + n_progs, ... and writes its dw sum to ``part[pid]``.
    ``PREFETCH`` issues the next block's loads before this block's reductions, so
    each program keeps memory requests in flight across its serial loop.
    """
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    cmask = cols < N
    w = tl.load(w_ptr + cols * wsn, mask=cmask, other=0.0).to(ACC)
    dw = tl.zeros([BLOCK_N], part_ptr.dtype.element_ty)
    if PREFETCH:
        rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
        mask = (rows < n_rows)[:, None] & cmask[None, :]
        x_next = load_tile_raw(x_ptr, rows, cols, mask, R1, R2, xs0, xs1, xs2, xsn, NLEAD)
        dy_next = load_tile_raw(dy_ptr, rows, cols, mask, R1, R2, ds0, ds1, ds2, dsn, NLEAD)
    for blk in range(pid, tl.cdiv(n_rows, BLOCK_M), n_progs):
        rows = blk * BLOCK_M + tl.arange(0, BLOCK_M)
        mask = (rows < n_rows)[:, None] & cmask[None, :]
        if PREFETCH:
            x = x_next.to(ACC)
            dy = dy_next.to(ACC)
            nrows = rows + n_progs * BLOCK_M
            nmask = (nrows < n_rows)[:, None] & cmask[None, :]
            x_next = load_tile_raw(x_ptr, nrows, cols, nmask, R1, R2, xs0, xs1, xs2, xsn, NLEAD)
            dy_next = load_tile_raw(dy_ptr, nrows, cols, nmask, R1, R2, ds0, ds1, ds2, dsn, NLEAD)
        else:
            x = load_tile(x_ptr, rows, cols, mask, R1, R2, xs0, xs1, xs2, xsn, NLEAD, ACC)
            dy = load_tile(dy_ptr, rows, cols, mask, R1, R2, ds0, ds1, ds2, dsn, NLEAD, ACC)
        rstd = inv_sqrt(tl.sum(x * x, axis=1) / N + eps, ACC)
        xhat = x * rstd[:, None]
        wdy = dy * w[None, :]
        c = tl.sum(xhat * wdy, axis=1) / N
        dx = (wdy - xhat * c[:, None]) * rstd[:, None]
        if HAS_GH:
            dx += load_tile(gh_ptr, rows, cols, mask, R1, R2, gs0, gs1, gs2, gsn, NLEAD, ACC)
        out = rows.to(tl.int64)[:, None] * N + cols[None, :]
        tl.store(dx_ptr + out, round_to(dx, dx_ptr.dtype.element_ty, RNE), mask=mask)
        dw += tl.sum((dy * xhat).to(part_ptr.dtype.element_ty), axis=0)
    tl.store(part_ptr + pid.to(tl.int64) * N + cols, dw, mask=cmask)


@triton.jit
def _rms_norm_bwd_kernel(  # type: ignore[no-untyped-def]  # noqa: PLR0917 (Triton kernels take positional args)
    x_ptr, w_ptr, dy_ptr, dx_ptr, part_ptr, n_rows, N, R1, R2,
    xs0, xs1, xs2, xsn, ds0, ds1, ds2, dsn, wsn, eps, n_progs,
    NLEAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PREFETCH: tl.constexpr, ACC: tl.constexpr, RNE: tl.constexpr,
):  # fmt: skip
    _rms_bwd_body(
        x_ptr, w_ptr, dy_ptr, dy_ptr, dx_ptr, part_ptr, n_rows, N, R1, R2,
        xs0, xs1, xs2, xsn, ds0, ds1, ds2, dsn, ds0, ds1, ds2, dsn, wsn, eps, n_progs,
        NLEAD, BLOCK_M, BLOCK_N, False, PREFETCH, ACC, RNE,
    )  # fmt: skip


@triton.jit
def _rms_norm_bwd_stats_kernel(  # type: ignore[no-untyped-def]  # noqa: PLR0917 (Triton kernels take positional args)
    x_ptr, w_ptr, dy_ptr, stats_ptr, N, R1, R2,
    xs0, xs1, xs2, xsn, ds0, ds1, ds2, dsn, wsn, eps,
    NLEAD: tl.constexpr, BLOCK_N: tl.constexpr, ACC: tl.constexpr,
):  # fmt: skip
    """Wide rows, pass 1: per row rstd and k = rstd^3 * mean(x * dy*w), so that dx = rstd*dy*w - x*k."""
    row = tl.program_id(0)
    rows = row + tl.arange(0, 1)
    ss = tl.zeros([1, BLOCK_N], ACC)
    sd = tl.zeros([1, BLOCK_N], ACC)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        cmask = cols < N
        mask = cmask[None, :] & (rows >= 0)[:, None]
        x = load_tile(x_ptr, rows, cols, mask, R1, R2, xs0, xs1, xs2, xsn, NLEAD, ACC)
        dy = load_tile(dy_ptr, rows, cols, mask, R1, R2, ds0, ds1, ds2, dsn, NLEAD, ACC)
        w = tl.load(w_ptr + cols * wsn, mask=cmask, other=0.0).to(ACC)
        ss += x * x
        sd += x * dy * w[None, :]
    rstd = inv_sqrt(tl.sum(ss, axis=1) / N + eps, ACC)
    k = rstd * rstd * rstd * tl.sum(sd, axis=1) / N
    tl.store(stats_ptr + rows.to(tl.int64) * 2, rstd)
    tl.store(stats_ptr + rows.to(tl.int64) * 2 + 1, k)


@triton.jit
def _rms_norm_bwd_tiles_kernel(  # type: ignore[no-untyped-def]  # noqa: PLR0917 (Triton kernels take positional args)
    x_ptr, w_ptr, dy_ptr, gh_ptr, stats_ptr, dx_ptr, part_ptr, n_rows, N, R1, R2,
    xs0, xs1, xs2, xsn, ds0, ds1, ds2, dsn, gs0, gs1, gs2, gsn, wsn, n_progs,
    NLEAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_GH: tl.constexpr, ACC: tl.constexpr, RNE: tl.constexpr,
):  # fmt: skip
    """Wide rows, pass 2: a column chunk per program along axis 0, a row-block stride along axis 1."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    pid_m = tl.program_id(1)
    cmask = cols < N
    w = tl.load(w_ptr + cols * wsn, mask=cmask, other=0.0).to(ACC)
    dw = tl.zeros([BLOCK_N], part_ptr.dtype.element_ty)
    for blk in range(pid_m, tl.cdiv(n_rows, BLOCK_M), n_progs):
        rows = blk * BLOCK_M + tl.arange(0, BLOCK_M)
        rmask = rows < n_rows
        mask = rmask[:, None] & cmask[None, :]
        x = load_tile(x_ptr, rows, cols, mask, R1, R2, xs0, xs1, xs2, xsn, NLEAD, ACC)
        dy = load_tile(dy_ptr, rows, cols, mask, R1, R2, ds0, ds1, ds2, dsn, NLEAD, ACC)
        rstd = tl.load(stats_ptr + rows.to(tl.int64) * 2, mask=rmask, other=0.0)
        k = tl.load(stats_ptr + rows.to(tl.int64) * 2 + 1, mask=rmask, other=0.0)
        dx = dy * w[None, :] * rstd[:, None] - x * k[:, None]
        if HAS_GH:
            dx += load_tile(gh_ptr, rows, cols, mask, R1, R2, gs0, gs1, gs2, gsn, NLEAD, ACC)
        out = rows.to(tl.int64)[:, None] * N + cols[None, :]
        tl.store(dx_ptr + out, round_to(dx, dx_ptr.dtype.element_ty, RNE), mask=mask)
        dw += tl.sum((dy * x * rstd[:, None]).to(part_ptr.dtype.element_ty), axis=0)
    tl.store(part_ptr + pid_m.to(tl.int64) * N + cols, dw, mask=cmask)


_F32 = {"ACC": "fp32"}
#: What the build check compiles for sm_80 / sm_90 (see validators/checks/triton_build.py).
TRITON_BUILD_SIGNATURES = {
    "_rms_norm_fwd_kernel": build_signature(
        _rms_norm_fwd_kernel,
        {"NLEAD": 1, "BLOCK_M": 1, "BLOCK_N": 4096, "CHUNKED": False, "RNE": False, **_F32},
        num_warps=8,
    ),
    "_rms_norm_bwd_kernel": build_signature(
        _rms_norm_bwd_kernel,
        {"NLEAD": 1, "BLOCK_M": 1, "BLOCK_N": 4096, "PREFETCH": True, "RNE": False, **_F32},
        pointers={"part_ptr": "fp32"},
        num_warps=8,
    ),
    "_rms_norm_bwd_stats_kernel": build_signature(
        _rms_norm_bwd_stats_kernel,
        {"NLEAD": 1, "BLOCK_N": 4096, **_F32},
        pointers={"stats_ptr": "fp32"},
        num_warps=8,
    ),
    "_rms_norm_bwd_tiles_kernel": build_signature(
        _rms_norm_bwd_tiles_kernel,
        {"NLEAD": 1, "BLOCK_M": 4, "BLOCK_N": 1024, "HAS_GH": False, "RNE": False, **_F32},
        pointers={"stats_ptr": "fp32", "part_ptr": "fp32"},
    ),
}
