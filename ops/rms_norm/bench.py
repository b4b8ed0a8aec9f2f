"""Benchmark opgate::rms_norm against aten, torch.compile(reference) and Liger-Kernel (CUDA only).

    python -m opgate.ops.rms_norm.bench [--shapes 8x4096,4096x4096,32768x8192] [--dtypes bf16] [--out FILE]

Bytes: forward reads x, w and writes y; backward reads x, dy, w and writes dx, dw.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from opgate.ops._bench import Impl, Problem, liger, main, spec_impl

EPS = 1e-6


def problems(shape: tuple[int, ...], dtype: torch.dtype, dname: str, device: torch.device) -> Problem:
    m, n = shape
    x = torch.randn(shape, device=device, dtype=dtype)
    w = (1.0 + 0.1 * torch.randn(n, device=device)).to(dtype)
    s = x.element_size()
    return Problem(f"{m}x{n}", dname, (x, w, EPS), (0, 1), 2 * m * n * s + n * s, 3 * m * n * s + 2 * n * s)


def impls() -> list[Impl]:
    import opgate.ops.rms_norm.triton_impl
    from opgate.ops.rms_norm import reference

    op = torch.ops.opgate.rms_norm.default

    def aten(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), w, eps)

    out: list[Impl] = [
        ("opgate triton", op),
        ("opgate triton, compiled", torch.compile(op)),
        ("aten F.rms_norm", aten),
        ("compile(reference)", torch.compile(reference.rms_norm)),
    ]
    native = spec_impl("rms_norm", "cuda")
    if native is not None:
        out.insert(1, ("opgate cuda", native))
    fn = liger("liger_kernel.transformers.functional", "liger_rms_norm")
    if fn is not None:
        out.append(("liger", fn))
    assert opgate.ops.rms_norm.triton_impl.OP
    return out


if __name__ == "__main__":
    sys.exit(main("rms_norm", "8x4096,4096x4096,32768x8192,65536x4096", problems, impls))
