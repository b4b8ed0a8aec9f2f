"""``opgate::layer_norm``: LayerNorm (+ optional fused exact GELU) as an opaque custom op over Triton.

Fusing the GELU saves a full read and write of the activation; the backward
recomputes the normalized value and the GELU derivative from x instead of
saving them (x is read anyway).  dw and db are reduced deterministically
through a (2, G, N) partial buffer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from opgate.ops import _replay as replay
from opgate.ops._replay.formula import Formula
from opgate.ops._triton_device import reduce_partials
from opgate.ops._triton_util import (
    BWD_TUNING,
    MAX_FUSED_BWD,
    MAX_FUSED_FWD,
    acc_dtype,
    bwd_warps,
    cdiv,
    check,
    check_float,
    check_same_device,
    collapse_rows,
    interpreting,
    needs_rne,
    next_pow2,
    partial_dtype,
    persistent_programs,
    row_tile,
)
from opgate.ops.layer_norm import triton_kernels as K

OP = "opgate::layer_norm"


def _forward(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float, gelu: bool) -> torch.Tensor:
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if y.numel() == 0:
        return y
    n = x.shape[-1]
    rows = collapse_rows(OP, x.shape, [x])
    tile = row_tile(rows.n_rows, n, x.element_size(), MAX_FUSED_FWD)
    K._layer_norm_fwd_kernel[(cdiv(rows.n_rows, tile.BLOCK_M),)](
        x, w, b, y, rows.n_rows, n, *rows.sizes, *rows.args(0), x.stride(-1), w.stride(0), b.stride(0), eps,
        NLEAD=rows.nlead, BLOCK_M=tile.BLOCK_M, BLOCK_N=tile.BLOCK_N, CHUNKED=tile.chunked, GELU=gelu,
        ACC=acc_dtype(x.dtype, w.dtype, b.dtype), RNE=needs_rne(y), num_warps=tile.num_warps,
    )  # fmt: skip
    return y


def _backward_launch(
    dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, *, eps: float, gelu: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n = x.shape[-1]
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        zeros = [torch.zeros(t.shape, dtype=t.dtype, device=t.device) for t in (w, b)]
        return dx, zeros[0], zeros[1]
    rows = collapse_rows(OP, x.shape, [x, dy])
    acc = acc_dtype(x.dtype, w.dtype, b.dtype, dy.dtype)
    tacc = torch.float64 if torch.float64 in (x.dtype, w.dtype, b.dtype, dy.dtype) else torch.float32
    strides = (*rows.args(0), x.stride(-1), *rows.args(1), dy.stride(-1))
    meta: dict[str, Any] = {"NLEAD": rows.nlead, "GELU": gelu, "ACC": acc}
    if next_pow2(n) <= MAX_FUSED_BWD:
        tile = row_tile(rows.n_rows, n, x.element_size(), MAX_FUSED_BWD)
        progs = persistent_programs(x.device, cdiv(rows.n_rows, tile.BLOCK_M))
        partial = torch.empty((2, progs, n), dtype=partial_dtype(w.dtype, b.dtype), device=x.device)
        K._layer_norm_bwd_kernel[(progs,)](
            x, w, b, dy, dx, partial, rows.n_rows, n, *rows.sizes, *strides,
            w.stride(0), b.stride(0), eps, progs,
            BLOCK_M=tile.BLOCK_M, BLOCK_N=tile.BLOCK_N, PREFETCH=bool(BWD_TUNING["prefetch"]),
            RNE=needs_rne(dx), num_warps=bwd_warps(tile), **meta,
        )  # fmt: skip
    else:
        stats = torch.empty((rows.n_rows, 4), dtype=tacc, device=x.device)
        K._layer_norm_bwd_stats_kernel[(rows.n_rows,)](
            x, w, b, dy, stats, n, *rows.sizes, *strides, w.stride(0), b.stride(0), eps,
            BLOCK_N=4096, num_warps=8, **meta,
        )  # fmt: skip
        block_m, block_n = (8, 4096) if interpreting() else (4, 1024)
        n_col = cdiv(n, block_n)
        progs = max(1, persistent_programs(x.device, cdiv(rows.n_rows, block_m)) // n_col)
        partial = torch.empty((2, progs, n), dtype=partial_dtype(w.dtype, b.dtype), device=x.device)
        K._layer_norm_bwd_tiles_kernel[(n_col, progs)](
            x, w, b, dy, stats, dx, partial, rows.n_rows, n, *rows.sizes, *strides, w.stride(0), b.stride(0),
            progs, BLOCK_M=block_m, BLOCK_N=block_n, RNE=needs_rne(dx), num_warps=4, **meta,
        )  # fmt: skip
    dw = reduce_partials(partial[0], torch.empty(w.shape, dtype=w.dtype, device=w.device))
    db = reduce_partials(partial[1], torch.empty(b.shape, dtype=b.dtype, device=b.device))
    return dx, dw, db


def _shape_message(expected: str, t: torch.Tensor) -> Callable[[], str]:
    return lambda: f"{OP}: {expected}, got {tuple(t.shape)}"


def _check(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> None:
    for name, t in (("x", x), ("w", w), ("b", b)):
        check_float(OP, name, t)
    check_same_device(OP, {"x": x, "w": w, "b": b})
    check(x.dim() >= 1, lambda: f"{OP}: x must have at least 1 dim, got shape {tuple(x.shape)}")
    for name, t in (("w", w), ("b", b)):
        check(
            t.dim() == 1 and t.shape[0] == x.shape[-1],
            _shape_message(f"{name} must be ({x.shape[-1]},) to match x's last dim", t),
        )


def _layer_norm(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float = 1e-5, gelu: bool = False
) -> torch.Tensor:
    """gelu?((x - mean) / sqrt(var + eps) * w + b) over the last dim, in float32 (float64 for float64)."""
    _check(x, w, b)
    return _forward(x, w, b, eps, gelu)


layer_norm = torch.library.custom_op(OP, mutates_args=())(_layer_norm)


@layer_norm.register_fake
def _fake(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float = 1e-5, gelu: bool = False
) -> torch.Tensor:
    _check(x, w, b)
    return x.new_empty(x.shape)


def _layer_norm_backward(  # noqa: PLR0917 (the op schema is positional)
    dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float, gelu: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dw, db) of layer_norm."""
    _check(x, w, b)
    check(dy.shape == x.shape, lambda: f"{OP}: grad shape {tuple(dy.shape)} != x {tuple(x.shape)}")
    return _backward_launch(dy, x, w, b, eps=eps, gelu=gelu)


layer_norm_backward = torch.library.custom_op("opgate::layer_norm_backward", mutates_args=())(
    _layer_norm_backward
)


@layer_norm_backward.register_fake
def _backward_fake(  # noqa: PLR0917 (mirrors the op schema)
    dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float, gelu: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return x.new_empty(x.shape), w.new_empty(w.shape), b.new_empty(b.shape)


#: backward(dy, x, w, b, eps, gelu) -> (dx, dw, db)
FORMULA = Formula(
    "opgate::layer_norm_backward",
    (("grad", 0), ("input", 0), ("input", 1), ("input", 2), ("input", 3), ("input", 4)),
    (0, 1, 2, None, None),
)
FORMULA.register(layer_norm)
replay.attach(OP, _layer_norm, FORMULA)
replay.attach(FORMULA.backward, _layer_norm_backward)
