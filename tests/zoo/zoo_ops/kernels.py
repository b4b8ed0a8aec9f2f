"""The one Triton RMSNorm kernel every zoo op launches, and its launcher.

Correct by default: stride-aware, masked tails, float32 accumulation (float64
for float64).  The launcher's keyword arguments are the knobs the planted
faults turn (which tensor and strides reach the kernel, the accumulator type,
the grid rounding); each fault module documents the bug it plants.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

#: Widest column chunk per program (a wider row is walked in chunks).
MAX_BLOCK_N = 1024
#: Elements per program tile (rows x columns).
TILE = 8192


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


#: Rounding of a float32 -> bfloat16 cast: the hardware's (round to nearest even on GPUs),
#: emulated nearest-even (Triton's CPU interpreter truncates), or truncation.
NATIVE, NEAREST, TRUNCATE = 0, 1, 2


@triton.jit
def _round_to(y, dtype: tl.constexpr, ROUND: tl.constexpr):  # type: ignore[no-untyped-def]
    """Cast ``y`` to ``dtype``; for bfloat16, ``ROUND`` fixes the rounding in integer arithmetic first."""
    if ROUND == 1:
        u = y.to(tl.float32).to(tl.uint32, bitcast=True)
        y = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)
    elif ROUND == 2:
        u = y.to(tl.float32).to(tl.uint32, bitcast=True)
        y = (u & 0xFFFF0000).to(tl.float32, bitcast=True)
    return y.to(dtype)


@triton.jit
def _zoo_rms_fwd_kernel(  # type: ignore[no-untyped-def]  # noqa: PLR0917 - Triton kernels take positional args
    x_ptr, w_ptr, y_ptr, M, N, sxm, sxn, sw, sym, syn, eps,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CT: tl.constexpr, ACC: tl.constexpr,
    ROUND_ACC: tl.constexpr, ROUND_OUT: tl.constexpr, TWICE: tl.constexpr = False,
):  # fmt: skip
    pid = tl.program_id(0)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < M
    cols = tl.arange(0, BLOCK_N)
    x_row = x_ptr + rows[:, None].to(tl.int64) * sxm
    acc = tl.zeros([BLOCK_M], dtype=ACC)
    for start in range(0, N, BLOCK_N):
        c = start + cols
        m = rmask[:, None] & (c[None, :] < N)
        x = tl.load(x_row + c[None, :].to(tl.int64) * sxn, mask=m, other=0.0).to(CT)
        acc = _round_to(acc.to(CT) + tl.sum(x * x, 1), ACC, ROUND_ACC)
    rstd = 1.0 / tl.sqrt(acc.to(CT) / N + eps)
    y_row = y_ptr + rows[:, None].to(tl.int64) * sym
    for start in range(0, N, BLOCK_N):
        c = start + cols
        m = rmask[:, None] & (c[None, :] < N)
        x = tl.load(x_row + c[None, :].to(tl.int64) * sxn, mask=m, other=0.0).to(CT)
        w = tl.load(w_ptr + c.to(tl.int64) * sw, mask=c < N, other=0.0).to(CT)
        y = x * rstd[:, None]
        if TWICE:  # x * rstd rounded to the output dtype before * w (Liger, HF LlamaRMSNorm)
            y = _round_to(y, y_ptr.dtype.element_ty, ROUND_OUT).to(CT)
        y = y * w[None, :]
        tl.store(
            y_row + c[None, :].to(tl.int64) * syn, _round_to(y, y_ptr.dtype.element_ty, ROUND_OUT), mask=m
        )


def compute_type(dtype: torch.dtype) -> tl.dtype:
    return tl.float64 if dtype == torch.float64 else tl.float32


def check(x: torch.Tensor, w: torch.Tensor) -> None:
    torch._check(x.dim() == 2, lambda: f"zoo ops take 2-d x, got shape {tuple(x.shape)}")
    torch._check(w.dim() == 1 and w.shape[0] == x.shape[1], lambda: "w must be (N,) with N = x.shape[1]")


def launch(
    x: torch.Tensor,
    w: torch.Tensor,
    eps: float,
    *,
    base: torch.Tensor | None = None,
    strides: tuple[int, int] | None = None,
    acc: tl.dtype | None = None,
    truncate_acc: bool = False,
    block_n: int | None = None,
    block_m: int | None = None,
    floor_grid: bool = False,
    out: torch.Tensor | None = None,
    round_twice: bool = False,
) -> torch.Tensor:
    """y = rms_norm(x, w); the keyword arguments exist only for the planted faults.

    ``base``: tensor whose data pointer is passed for x; ``strides``: x strides
    passed to the kernel; ``acc``: accumulator type; ``floor_grid``: M // BLOCK_M
    programs instead of cdiv; ``out``: write y there (``x`` itself: in place);
    ``round_twice``: round ``x * rstd`` to the output dtype before ``* w``.
    """
    check(x, w)
    M, N = x.shape
    y = out if out is not None else x.new_empty((M, N))
    if y.numel() == 0:
        return y
    bn = block_n or min(triton.next_power_of_2(N), MAX_BLOCK_N)
    bm = block_m or max(1, min(64, TILE // bn, triton.next_power_of_2(M)))
    grid = (M // bm,) if floor_grid else (triton.cdiv(M, bm),)
    sxm, sxn = strides if strides is not None else (x.stride(0), x.stride(1))
    ct = compute_type(x.dtype)
    acc = acc or ct
    nearest = NEAREST if interpreting() else NATIVE
    round_acc = TRUNCATE if truncate_acc else (nearest if acc == tl.bfloat16 else NATIVE)
    _zoo_rms_fwd_kernel[grid](
        base if base is not None else x, w, y, M, N, sxm, sxn, w.stride(0), y.stride(0), y.stride(1), eps,
        BLOCK_M=bm, BLOCK_N=bn, CT=ct, ACC=acc,
        ROUND_ACC=round_acc, ROUND_OUT=nearest if x.dtype == torch.bfloat16 else NATIVE, TWICE=round_twice,
    )  # fmt: skip
    return y
