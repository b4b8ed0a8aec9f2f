"""Triton kernels for LayerNorm with an optional fused exact GELU.

Same layout contract as the RMSNorm kernels: strided inputs through
:func:`ops._triton_util.load_tile`, contiguous outputs at ``row * N + col``.
The variance is two-pass (mean first, then the centred sum of squares) so that
activations with a large mean do not lose precision.  GELU is the exact
erf form, 0.5 z (1 + erf(z / sqrt 2)), applied to z = xhat * w + b.
"""

from __future__ import annotations

import triton
import triton.language as tl

from opgate.ops._triton_device import inv_sqrt, load_tile, load_tile_raw, round_to
from opgate.ops._triton_util import build_signature

INV_SQRT2 = tl.constexpr(0.7071067811865476)
INV_SQRT_2PI = tl.constexpr(0.3989422804014327)


@triton.jit
def _gelu(z, GELU: tl.constexpr):  # type: ignore[no-untyped-def]
    if GELU:
        z = 0.5 * z * (1.0 + tl.math.erf(z * INV_SQRT2))
    return z


@triton.jit
def _gelu_grad(z):  # type: ignore[no-untyped-def]
    return 0.5 * (1.0 + tl.math.erf(z * INV_SQRT2)) + z * tl.exp(-0.5 * z * z) * INV_SQRT_2PI


@triton.jit
def _layer_norm_fwd_kernel(  # type: ignore[no-untyped-def]  # noqa: PLR0917 (Triton kernels take positional args)
    x_ptr, w_ptr, b_ptr, y_ptr, n_rows, N, R1, R2, xs0, xs1, xs2, xsn, wsn, bsn, eps,
    NLEAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CHUNKED: tl.constexpr,
    GELU: tl.constexpr, ACC: tl.constexpr, RNE: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < n_rows
    out_row = rows.to(tl.int64)[:, None] * N
    if not CHUNKED:
        cols = tl.arange(0, BLOCK_N)
        cmask = cols < N
        mask = rmask[:, None] & cmask[None, :]
        x = load_tile(x_ptr, rows, cols, mask, R1, R2, xs0, xs1, xs2, xsn, NLEAD, ACC)
        mean = tl.sum(x, axis=1) / N
        xc = tl.where(mask, x - mean[:, None], 0.0)
        rstd = inv_sqrt(tl.sum(xc * xc, axis=1) / N + eps, ACC)
        w = tl.load(w_ptr + cols * wsn, mask=cmask, other=0.0).to(ACC)
        b = tl.load(b_ptr + cols * bsn, mask=cmask, other=0.0).to(ACC)
        y = _gelu(xc * rstd[:, None] * w[None, :] + b[None, :], GELU)
        tl.store(y_ptr + out_row + cols[None, :], round_to(y, y_ptr.dtype.element_ty, RNE), mask=mask)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], ACC)
        for start in range(0, N, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = rmask[:, None] & (cols < N)[None, :]
            acc += load_tile(x_ptr, rows, cols, mask, R1, R2, xs0, xs1, xs2, xsn, NLEAD, ACC)
        mean = tl.sum(acc, axis=1) / N
        acc = tl.zeros([BLOCK_M, BLOCK_N], ACC)
        for start in range(0, N, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = rmask[:, None] & (cols < N)[None, :]
            x = load_tile(x_ptr, rows, cols, mask, R1, R2, xs0, xs1, xs2, xsn, NLEAD, ACC)
            xc = tl.where(mask, x - mean[:, None], 0.0)
            acc += xc * xc
        rstd = inv_sqrt(tl.sum(acc, axis=1) / N + eps, ACC)
        for start in range(0, N, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            cmask = cols < N
            mask = rmask[:, None] & cmask[None, :]
            x = load_tile(x_ptr, rows, cols, mask, R1, R2, xs0, xs1, xs2, xsn, NLEAD, ACC)
            w = tl.load(w_ptr + cols * wsn, mask=cmask, other=0.0).to(ACC)
            b = tl.load(b_ptr + cols * bsn, mask=cmask, other=0.0).to(ACC)
            y = _gelu((x - mean[:, None]) * rstd[:, None] * w[None, :] + b[None, :], GELU)
            tl.store(y_ptr + out_row + cols[None, :], round_to(y, y_ptr.dtype.element_ty, RNE), mask=mask)


@triton.jit
def _layer_norm_bwd_kernel(  # type: ignore[no-untyped-def]  # noqa: PLR0917 (Triton kernels take positional args)
    x_ptr, w_ptr, b_ptr, dy_ptr, dx_ptr, part_ptr, n_rows, N, R1, R2,
    xs0, xs1, xs2, xsn, ds0, ds1, ds2, dsn, wsn, bsn, eps, n_progs,
    NLEAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    GELU: tl.constexpr, PREFETCH: tl.constexpr, ACC: tl.constexpr, RNE: tl.constexpr,
):  # fmt: skip
    """Persistent backward: dx = rstd (w dz - mean(w dz) - xhat mean(w dz xhat)); dw, db partials.

    dz = dy, or dy * gelu'(xhat w + b) with the GELU fused.  Partials: part[0, pid] = dw,
    part[1, pid] = db (a (2, n_progs, N) buffer).
    """
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    cmask = cols < N
    w = tl.load(w_ptr + cols * wsn, mask=cmask, other=0.0).to(ACC)
    b = tl.load(b_ptr + cols * bsn, mask=cmask, other=0.0).to(ACC)
    dw = tl.zeros([BLOCK_N], part_ptr.dtype.element_ty)
    db = tl.zeros([BLOCK_N], part_ptr.dtype.element_ty)
    if PREFETCH:  # next block's loads go out before this block's reductions
        rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
        mask = (rows < n_rows)[:, None] & cmask[None, :]
        x_next = load_tile_raw(x_ptr, rows, cols, mask, R1, R2, xs0, xs1, xs2, xsn, NLEAD)
        dy_next = load_tile_raw(dy_ptr, rows, cols, mask, R1, R2, ds0, ds1, ds2, dsn, NLEAD)
    for blk in range(pid, tl.cdiv(n_rows, BLOCK_M), n_progs):
        rows = blk * BLOCK_M + tl.arange(0, BLOCK_M)
        mask = (rows < n_rows)[:, None] & cmask[None, :]
        if PREFETCH:
            x = x_next.to(ACC)
            dz = dy_next.to(ACC)
            nrows = rows + n_progs * BLOCK_M
            nmask = (nrows < n_rows)[:, None] & cmask[None, :]
            x_next = load_tile_raw(x_ptr, nrows, cols, nmask, R1, R2, xs0, xs1, xs2, xsn, NLEAD)
            dy_next = load_tile_raw(dy_ptr, nrows, cols, nmask, R1, R2, ds0, ds1, ds2, dsn, NLEAD)
        else:
            x = load_tile(x_ptr, rows, cols, mask, R1, R2, xs0, xs1, xs2, xsn, NLEAD, ACC)
            dz = load_tile(dy_ptr, rows, cols, mask, R1, R2, ds0, ds1, ds2, dsn, NLEAD, ACC)
        mean = tl.sum(x, axis=1) / N
        xc = tl.where(mask, x - mean[:, None], 0.0)
        rstd = inv_sqrt(tl.sum(xc * xc, axis=1) / N + eps, ACC)
        xhat = xc * rstd[:, None]
        if GELU:
            dz = dz * _gelu_grad(xhat * w[None, :] + b[None, :])
        wdz = dz * w[None, :]
        c1 = tl.sum(wdz, axis=1) / N
        c2 = tl.sum(wdz * xhat, axis=1) / N
        dx = (wdz - c1[:, None] - xhat * c2[:, None]) * rstd[:, None]
        out = rows.to(tl.int64)[:, None] * N + cols[None, :]
        tl.store(dx_ptr + out, round_to(dx, dx_ptr.dtype.element_ty, RNE), mask=mask)
        dw += tl.sum((dz * xhat).to(part_ptr.dtype.element_ty), axis=0)
        db += tl.sum(dz.to(part_ptr.dtype.element_ty), axis=0)
    tl.store(part_ptr + pid.to(tl.int64) * N + cols, dw, mask=cmask)
    tl.store(part_ptr + (n_progs + pid).to(tl.int64) * N + cols, db, mask=cmask)


@triton.jit
def _layer_norm_bwd_stats_kernel(  # type: ignore[no-untyped-def]  # noqa: PLR0917 (Triton kernels take positional args)
    x_ptr, w_ptr, b_ptr, dy_ptr, stats_ptr, N, R1, R2,
    xs0, xs1, xs2, xsn, ds0, ds1, ds2, dsn, wsn, bsn, eps,
    NLEAD: tl.constexpr, BLOCK_N: tl.constexpr, GELU: tl.constexpr, ACC: tl.constexpr,
):  # fmt: skip
    """Wide rows, pass 1 (one row per program): stats[row] = (mean, rstd, c1, c2)."""
    rows = tl.program_id(0) + tl.arange(0, 1)
    acc = tl.zeros([1, BLOCK_N], ACC)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = (rows >= 0)[:, None] & (cols < N)[None, :]
        acc += load_tile(x_ptr, rows, cols, mask, R1, R2, xs0, xs1, xs2, xsn, NLEAD, ACC)
    mean = tl.sum(acc, axis=1) / N
    acc = tl.zeros([1, BLOCK_N], ACC)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = (rows >= 0)[:, None] & (cols < N)[None, :]
        x = load_tile(x_ptr, rows, cols, mask, R1, R2, xs0, xs1, xs2, xsn, NLEAD, ACC)
        xc = tl.where(mask, x - mean[:, None], 0.0)
        acc += xc * xc
    rstd = inv_sqrt(tl.sum(acc, axis=1) / N + eps, ACC)
    a1 = tl.zeros([1, BLOCK_N], ACC)
    a2 = tl.zeros([1, BLOCK_N], ACC)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        cmask = cols < N
        mask = (rows >= 0)[:, None] & cmask[None, :]
        x = load_tile(x_ptr, rows, cols, mask, R1, R2, xs0, xs1, xs2, xsn, NLEAD, ACC)
        dz = load_tile(dy_ptr, rows, cols, mask, R1, R2, ds0, ds1, ds2, dsn, NLEAD, ACC)
        w = tl.load(w_ptr + cols * wsn, mask=cmask, other=0.0).to(ACC)
        xhat = tl.where(mask, x - mean[:, None], 0.0) * rstd[:, None]
        if GELU:
            b = tl.load(b_ptr + cols * bsn, mask=cmask, other=0.0).to(ACC)
            dz = dz * _gelu_grad(xhat * w[None, :] + b[None, :])
        a1 += dz * w[None, :]
        a2 += dz * w[None, :] * xhat
    base = stats_ptr + rows.to(tl.int64) * 4
    tl.store(base, mean)
    tl.store(base + 1, rstd)
    tl.store(base + 2, tl.sum(a1, axis=1) / N)
    tl.store(base + 3, tl.sum(a2, axis=1) / N)


@triton.jit
def _layer_norm_bwd_tiles_kernel(  # type: ignore[no-untyped-def]  # noqa: PLR0917 (Triton kernels take positional args)
    x_ptr, w_ptr, b_ptr, dy_ptr, stats_ptr, dx_ptr, part_ptr, n_rows, N, R1, R2,
    xs0, xs1, xs2, xsn, ds0, ds1, ds2, dsn, wsn, bsn, n_progs,
    NLEAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    GELU: tl.constexpr, ACC: tl.constexpr, RNE: tl.constexpr,
):  # fmt: skip
    """Wide rows, pass 2: column chunk on axis 0, row-block stride on axis 1; dw/db partials."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    pid_m = tl.program_id(1)
    cmask = cols < N
    w = tl.load(w_ptr + cols * wsn, mask=cmask, other=0.0).to(ACC)
    b = tl.load(b_ptr + cols * bsn, mask=cmask, other=0.0).to(ACC)
    dw = tl.zeros([BLOCK_N], part_ptr.dtype.element_ty)
    db = tl.zeros([BLOCK_N], part_ptr.dtype.element_ty)
    for blk in range(pid_m, tl.cdiv(n_rows, BLOCK_M), n_progs):
        rows = blk * BLOCK_M + tl.arange(0, BLOCK_M)
        rmask = rows < n_rows
        mask = rmask[:, None] & cmask[None, :]
        x = load_tile(x_ptr, rows, cols, mask, R1, R2, xs0, xs1, xs2, xsn, NLEAD, ACC)
        dz = load_tile(dy_ptr, rows, cols, mask, R1, R2, ds0, ds1, ds2, dsn, NLEAD, ACC)
        base = stats_ptr + rows.to(tl.int64) * 4
        mean = tl.load(base, mask=rmask, other=0.0)
        rstd = tl.load(base + 1, mask=rmask, other=0.0)
        c1 = tl.load(base + 2, mask=rmask, other=0.0)
        c2 = tl.load(base + 3, mask=rmask, other=0.0)
        xhat = tl.where(mask, x - mean[:, None], 0.0) * rstd[:, None]
        if GELU:
            dz = dz * _gelu_grad(xhat * w[None, :] + b[None, :])
        dx = (dz * w[None, :] - c1[:, None] - xhat * c2[:, None]) * rstd[:, None]
        out = rows.to(tl.int64)[:, None] * N + cols[None, :]
        tl.store(dx_ptr + out, round_to(dx, dx_ptr.dtype.element_ty, RNE), mask=mask)
        dw += tl.sum((dz * xhat).to(part_ptr.dtype.element_ty), axis=0)
        db += tl.sum(dz.to(part_ptr.dtype.element_ty), axis=0)
    tl.store(part_ptr + pid_m.to(tl.int64) * N + cols, dw, mask=cmask)
    tl.store(part_ptr + (n_progs + pid_m).to(tl.int64) * N + cols, db, mask=cmask)


_F32 = {"ACC": "fp32", "GELU": True}
_PARTS = {"part_ptr": "fp32", "stats_ptr": "fp32"}
#: What the build check compiles for sm_80 / sm_90 (see validators/checks/triton_build.py).
TRITON_BUILD_SIGNATURES = {
    "_layer_norm_fwd_kernel": build_signature(
        _layer_norm_fwd_kernel,
        {"NLEAD": 1, "BLOCK_M": 1, "BLOCK_N": 4096, "CHUNKED": False, "RNE": False, **_F32},
        num_warps=8,
    ),
    "_layer_norm_bwd_kernel": build_signature(
        _layer_norm_bwd_kernel,
        {"NLEAD": 1, "BLOCK_M": 1, "BLOCK_N": 4096, "PREFETCH": True, "RNE": False, **_F32},
        pointers=_PARTS,
        num_warps=8,
    ),
    "_layer_norm_bwd_stats_kernel": build_signature(
        _layer_norm_bwd_stats_kernel, {"NLEAD": 1, "BLOCK_N": 4096, **_F32}, pointers=_PARTS, num_warps=8
    ),
    "_layer_norm_bwd_tiles_kernel": build_signature(
        _layer_norm_bwd_tiles_kernel,
        {"NLEAD": 1, "BLOCK_M": 4, "BLOCK_N": 1024, "RNE": False, **_F32},
        pointers=_PARTS,
    ),
}
