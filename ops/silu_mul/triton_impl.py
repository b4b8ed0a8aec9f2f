"""``opgate::silu_mul``: the SwiGLU gate silu(a) * b as an opaque custom op over Triton kernels.

Elementwise, so tiles are 2-d (rows x column block) over the jointly collapsed
leading dims: any strides, stride 0 included, without a copy.  The backward
recomputes sigmoid(a) instead of saving it (it is cheaper than the bytes).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from opgate.ops import _replay as replay
from opgate.ops._replay.formula import Formula
from opgate.ops._triton_device import load_tile, round_to
from opgate.ops._triton_util import (
    acc_dtype,
    build_signature,
    cdiv,
    check,
    check_float,
    check_same_device,
    collapse_rows,
    interpreting,
    needs_rne,
    next_pow2,
)

OP = "opgate::silu_mul"


@triton.jit
def _silu_mul_body(  # type: ignore[no-untyped-def]  # noqa: PLR0917 (Triton kernels take positional args)
    a_ptr, b_ptr, g_ptr, o1_ptr, o2_ptr, n_rows, N, R1, R2,
    as0, as1, as2, asn, bs0, bs1, bs2, bsn, gs0, gs1, gs2, gsn,
    NLEAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BACKWARD: tl.constexpr, ACC: tl.constexpr, RNE: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < n_rows)[:, None] & (cols < N)[None, :]
    a = load_tile(a_ptr, rows, cols, mask, R1, R2, as0, as1, as2, asn, NLEAD, ACC)
    b = load_tile(b_ptr, rows, cols, mask, R1, R2, bs0, bs1, bs2, bsn, NLEAD, ACC)
    s = 1.0 / (1.0 + tl.exp(-a))
    out = rows.to(tl.int64)[:, None] * N + cols[None, :]
    if BACKWARD:
        g = load_tile(g_ptr, rows, cols, mask, R1, R2, gs0, gs1, gs2, gsn, NLEAD, ACC)
        da = g * b * s * (1.0 + a * (1.0 - s))
        db = g * a * s
        tl.store(o1_ptr + out, round_to(da, o1_ptr.dtype.element_ty, RNE), mask=mask)
        tl.store(o2_ptr + out, round_to(db, o2_ptr.dtype.element_ty, RNE), mask=mask)
    else:
        tl.store(o1_ptr + out, round_to(a * s * b, o1_ptr.dtype.element_ty, RNE), mask=mask)


@triton.jit
def _silu_mul_fwd_kernel(  # type: ignore[no-untyped-def]  # noqa: PLR0917 (Triton kernels take positional args)
    a_ptr, b_ptr, y_ptr, n_rows, N, R1, R2, as0, as1, as2, asn, bs0, bs1, bs2, bsn,
    NLEAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ACC: tl.constexpr, RNE: tl.constexpr,
):  # fmt: skip
    _silu_mul_body(
        a_ptr, b_ptr, a_ptr, y_ptr, y_ptr, n_rows, N, R1, R2,
        as0, as1, as2, asn, bs0, bs1, bs2, bsn, as0, as1, as2, asn,
        NLEAD, BLOCK_M, BLOCK_N, False, ACC, RNE,
    )  # fmt: skip


@triton.jit
def _silu_mul_bwd_kernel(  # type: ignore[no-untyped-def]  # noqa: PLR0917 (Triton kernels take positional args)
    a_ptr, b_ptr, g_ptr, da_ptr, db_ptr, n_rows, N, R1, R2,
    as0, as1, as2, asn, bs0, bs1, bs2, bsn, gs0, gs1, gs2, gsn,
    NLEAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ACC: tl.constexpr, RNE: tl.constexpr,
):  # fmt: skip
    _silu_mul_body(
        a_ptr, b_ptr, g_ptr, da_ptr, db_ptr, n_rows, N, R1, R2,
        as0, as1, as2, asn, bs0, bs1, bs2, bsn, gs0, gs1, gs2, gsn,
        NLEAD, BLOCK_M, BLOCK_N, True, ACC, RNE,
    )  # fmt: skip


_META = {"NLEAD": 1, "BLOCK_M": 8, "BLOCK_N": 1024, "ACC": "fp32", "RNE": False}
#: What the build check compiles for sm_80 / sm_90 (see validators/checks/triton_build.py).
TRITON_BUILD_SIGNATURES = {
    "_silu_mul_fwd_kernel": build_signature(_silu_mul_fwd_kernel, _META, num_warps=8),
    "_silu_mul_bwd_kernel": build_signature(_silu_mul_bwd_kernel, _META, num_warps=8),
}


def _tile(n_rows: int, n: int, itemsize: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps): ~8k-element tiles on GPU, ~32k under the interpreter."""
    block_n = min(next_pow2(n), 4096 if interpreting() else 1024)
    target = 32768 if interpreting() else 8192
    block_m = max(1, min(target // block_n, next_pow2(n_rows)))
    warps = max(1, min(8, (block_m * block_n * itemsize) // (16 * 32 * 4)))
    return block_m, block_n, next_pow2(warps)


def _launch(a: torch.Tensor, b: torch.Tensor, g: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    outs = tuple(
        torch.empty(a.shape, dtype=t.dtype, device=a.device) for t in ((a,) if g is None else (a, b))
    )
    if a.numel() == 0:
        return outs
    n = a.shape[-1]
    tensors = [a, b] if g is None else [a, b, g]
    rows = collapse_rows(OP, a.shape, tensors)
    block_m, block_n, warps = _tile(rows.n_rows, n, a.element_size())
    grid = (cdiv(rows.n_rows, block_m), cdiv(n, block_n))
    meta: dict[str, Any] = {
        "NLEAD": rows.nlead,
        "BLOCK_M": block_m,
        "BLOCK_N": block_n,
        "ACC": acc_dtype(*(t.dtype for t in tensors)),
        "RNE": needs_rne(*outs),
        "num_warps": warps,
    }
    strides = [(*rows.args(i), t.stride(-1)) for i, t in enumerate(tensors)]
    if g is None:
        _silu_mul_fwd_kernel[grid](
            a, b, outs[0], rows.n_rows, n, *rows.sizes, *strides[0], *strides[1], **meta
        )
    else:
        _silu_mul_bwd_kernel[grid](
            a,
            b,
            g,
            outs[0],
            outs[1],
            rows.n_rows,
            n,
            *rows.sizes,
            *strides[0],
            *strides[1],
            *strides[2],
            **meta,
        )
    return outs


def _check(a: torch.Tensor, b: torch.Tensor) -> None:
    check_float(OP, "a", a)
    check_float(OP, "b", b)
    check_same_device(OP, {"a": a, "b": b})
    check(a.dim() >= 1, lambda: f"{OP}: a must have at least 1 dim")
    check(a.shape == b.shape, lambda: f"{OP}: a shape {tuple(a.shape)} != b shape {tuple(b.shape)}")


def _silu_mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """silu(a) * b in float32 (float64 for float64), stored in a's dtype."""
    _check(a, b)
    return _launch(a, b, None)[0]


silu_mul = torch.library.custom_op(OP, mutates_args=())(_silu_mul)


@silu_mul.register_fake
def _fake(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    _check(a, b)
    return a.new_empty(a.shape)


def _silu_mul_backward(
    g: torch.Tensor, a: torch.Tensor, b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(da, db) = (g * b * silu'(a), g * silu(a))."""
    _check(a, b)
    check(g.shape == a.shape, lambda: f"{OP}: grad shape {tuple(g.shape)} != {tuple(a.shape)}")
    da, db = _launch(a, b, g)
    return da, db


silu_mul_backward = torch.library.custom_op("opgate::silu_mul_backward", mutates_args=())(_silu_mul_backward)


@silu_mul_backward.register_fake
def _backward_fake(g: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return a.new_empty(a.shape), b.new_empty(b.shape)


#: backward(g, a, b) -> (da, db)
FORMULA = Formula("opgate::silu_mul_backward", (("grad", 0), ("input", 0), ("input", 1)), (0, 1))
FORMULA.register(silu_mul)
replay.attach(OP, _silu_mul, FORMULA)
replay.attach(FORMULA.backward, _silu_mul_backward)
