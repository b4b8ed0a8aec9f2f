"""Host-side launchers for the RMSNorm kernels, shared by ``rms_norm`` and ``fused_add_rms_norm``.

Why separate from the torch.library registration: both ops run the same kernels
(with or without the residual), and keeping the launch logic torch.library-free
lets the benchmark and the unit tests call it directly.

Nothing here copies an input: strides are passed to the kernels, outputs are
fresh contiguous tensors, empty inputs return before any launch.
"""

from __future__ import annotations

from typing import Any

import torch

from opgate.ops._triton_device import reduce_partials
from opgate.ops._triton_util import (
    BWD_TUNING,
    CHUNK,
    MAX_FUSED_BWD,
    MAX_FUSED_FWD,
    acc_dtype,
    bwd_warps,
    cdiv,
    collapse_rows,
    interpreting,
    needs_rne,
    next_pow2,
    partial_dtype,
    persistent_programs,
    row_tile,
)
from opgate.ops.rms_norm import triton_kernels as K


def _torch_acc(*dtypes: torch.dtype) -> torch.dtype:
    return torch.float64 if torch.float64 in dtypes else torch.float32


def rms_forward(
    op: str,
    x: torch.Tensor,
    w: torch.Tensor,
    eps: float,
    *,
    residual: torch.Tensor | None = None,
    fused_kernel: Any = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """y = rms_norm(x [+ residual]) and, with a residual, the new residual h = x + residual.

    With a residual, ``fused_kernel`` is the calling op's own forward kernel.
    """
    n = x.shape[-1]
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    h = torch.empty(x.shape, dtype=x.dtype, device=x.device) if residual is not None else None
    if y.numel() == 0:
        return y, h
    inputs = [x] if residual is None else [x, residual]
    rows = collapse_rows(op, x.shape, inputs)
    tile = row_tile(rows.n_rows, n, x.element_size(), MAX_FUSED_FWD)
    grid = (cdiv(rows.n_rows, tile.BLOCK_M),)
    common = {
        "NLEAD": rows.nlead,
        "BLOCK_M": tile.BLOCK_M,
        "BLOCK_N": tile.BLOCK_N,
        "CHUNKED": tile.chunked,
        "ACC": acc_dtype(x.dtype, w.dtype),
        "RNE": needs_rne(y),
        "num_warps": tile.num_warps,
    }
    R1, R2 = rows.sizes
    if residual is None:
        K._rms_norm_fwd_kernel[grid](
            x, w, y, rows.n_rows, n, R1, R2, *rows.args(0), x.stride(-1), w.stride(0), eps, **common
        )
    else:
        fused_kernel[grid](
            x, residual, h, w, y, rows.n_rows, n, R1, R2,
            *rows.args(0), x.stride(-1), *rows.args(1), residual.stride(-1), w.stride(0), eps,
            **common,
        )  # fmt: skip
    return y, h


def rms_backward(
    op: str,
    dy: torch.Tensor,
    x: torch.Tensor,
    w: torch.Tensor,
    eps: float,
    *,
    gh: torch.Tensor | None = None,
    fused_kernel: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, dw); ``gh`` (the new residual's own gradient) is added to dx.

    ``fused_kernel``: the calling op's own backward kernel (with the residual
    gradient input), so the profiler shows which op's backward ran.
    dw is reduced deterministically: each program writes its own row of a
    (G, N) partial buffer, a second kernel sums the G rows in a fixed order.
    """
    n = x.shape[-1]
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return dx, torch.zeros(w.shape, dtype=w.dtype, device=w.device)
    has_gh = gh is not None
    tensors = [x, dy, gh] if gh is not None else [x, dy]
    rows = collapse_rows(op, x.shape, tensors)
    g_args = (*rows.args(2), gh.stride(-1)) if gh is not None else (*rows.args(1), dy.stride(-1))
    g_ptr = gh if gh is not None else dy
    acc = acc_dtype(x.dtype, w.dtype, dy.dtype)
    tacc = _torch_acc(x.dtype, w.dtype, dy.dtype)
    rne = needs_rne(dx)
    R1, R2 = rows.sizes
    base = (rows.n_rows, n, R1, R2, *rows.args(0), x.stride(-1), *rows.args(1), dy.stride(-1))
    if next_pow2(n) <= MAX_FUSED_BWD:
        tile = row_tile(rows.n_rows, n, x.element_size(), MAX_FUSED_BWD)
        progs = persistent_programs(x.device, cdiv(rows.n_rows, tile.BLOCK_M))
        partial = torch.empty((progs, n), dtype=partial_dtype(w.dtype), device=x.device)
        meta = {
            "NLEAD": rows.nlead,
            "BLOCK_M": tile.BLOCK_M,
            "BLOCK_N": tile.BLOCK_N,
            "PREFETCH": bool(BWD_TUNING["prefetch"]),
            "ACC": acc,
            "RNE": rne,
            "num_warps": bwd_warps(tile),
        }
        if fused_kernel is not None:
            fused_kernel[(progs,)](
                x, w, dy, g_ptr, dx, partial, *base, *g_args, w.stride(0), eps, progs, HAS_GH=has_gh, **meta
            )
        else:
            K._rms_norm_bwd_kernel[(progs,)](x, w, dy, dx, partial, *base, w.stride(0), eps, progs, **meta)
    else:
        stats = torch.empty((rows.n_rows, 2), dtype=tacc, device=x.device)
        K._rms_norm_bwd_stats_kernel[(rows.n_rows,)](
            x, w, dy, stats, *base[1:], w.stride(0), eps,
            NLEAD=rows.nlead, BLOCK_N=CHUNK, ACC=acc, num_warps=8,
        )  # fmt: skip
        block_m, block_n = (8, 4096) if interpreting() else (4, 1024)
        n_col = cdiv(n, block_n)
        progs = max(1, persistent_programs(x.device, cdiv(rows.n_rows, block_m)) // n_col)
        partial = torch.empty((progs, n), dtype=partial_dtype(w.dtype), device=x.device)
        K._rms_norm_bwd_tiles_kernel[(n_col, progs)](
            x, w, dy, g_ptr, stats, dx, partial, *base, *g_args,
            w.stride(0), progs, NLEAD=rows.nlead, BLOCK_M=block_m, BLOCK_N=block_n,
            HAS_GH=has_gh, ACC=acc, RNE=rne, num_warps=4,
        )  # fmt: skip
    dw = torch.empty(w.shape, dtype=w.dtype, device=w.device)
    reduce_partials(partial, dw)
    return dx, dw
