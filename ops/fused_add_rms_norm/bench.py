"""Benchmark opgate::fused_add_rms_norm against aten, torch.compile(reference) and Liger (CUDA only).

    python -m opgate.ops.fused_add_rms_norm.bench [--shapes 8x4096,4096x4096,32768x8192] [--out FILE]

Bytes: forward reads x, residual, w and writes y, h; backward reads dy, dh, h, w and
writes one gradient shared by x and residual, plus dw.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from opgate.ops._bench import Impl, Problem, liger, main

EPS = 1e-6


def problems(shape: tuple[int, ...], dtype: torch.dtype, dname: str, device: torch.device) -> Problem:
    m, n = shape
    x = torch.randn(shape, device=device, dtype=dtype)
    r = torch.randn(shape, device=device, dtype=dtype)
    w = (1.0 + 0.1 * torch.randn(n, device=device)).to(dtype)
    s = x.element_size()
    return Problem(
        f"{m}x{n}", dname, (x, r, w, EPS), (0, 1, 2), 4 * m * n * s + n * s, 4 * m * n * s + 2 * n * s
    )


def _aten(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    h = x + r
    return F.rms_norm(h, (h.shape[-1],), w, eps), h


def impls() -> list[Impl]:
    import opgate.ops.fused_add_rms_norm.triton_impl as impl
    from opgate.ops.fused_add_rms_norm import reference

    op = torch.ops.opgate.fused_add_rms_norm.default
    out: list[Impl] = [
        ("opgate triton", op),
        ("opgate triton, compiled", torch.compile(op)),
        ("aten add + F.rms_norm", _aten),
        ("compile(reference)", torch.compile(reference.fused_add_rms_norm)),
    ]
    fn = liger("liger_kernel.transformers.functional", "liger_fused_add_rms_norm")
    if fn is not None:
        out.append(("liger", functools.partial(fn, in_place=False)))
    assert impl.OP
    return out


if __name__ == "__main__":
    sys.exit(main("fused_add_rms_norm", "8x4096,4096x4096,32768x8192", problems, impls))
