"""Benchmark opgate::layer_norm (+ fused GELU) against aten, torch.compile(reference) and Liger (CUDA only).

    python -m opgate.ops.layer_norm.bench [--shapes 8x4096x0,4096x4096x0,32768x8192x1] [--out FILE]

Shapes are MxNxG (G = 1 fuses the exact GELU).  Bytes: forward reads x, w, b and writes y;
backward reads x, dy, w, b and writes dx, dw, db.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from opgate.ops._bench import Impl, Problem, liger, main

EPS = 1e-5


def problems(shape: tuple[int, ...], dtype: torch.dtype, dname: str, device: torch.device) -> Problem:
    m, n, g = shape
    x = torch.randn((m, n), device=device, dtype=dtype)
    w = (1.0 + 0.1 * torch.randn(n, device=device)).to(dtype)
    b = (0.1 * torch.randn(n, device=device)).to(dtype)
    s = x.element_size()
    label = f"{m}x{n}" + (" +gelu" if g else "")
    fwd, bwd = 2 * m * n * s + 2 * n * s, 3 * m * n * s + 4 * n * s
    return Problem(label, dname, (x, w, b, EPS, bool(g)), (0, 1, 2), fwd, bwd)


def _aten(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float, gelu: bool) -> torch.Tensor:
    y = F.layer_norm(x, (x.shape[-1],), w, b, eps)
    return F.gelu(y) if gelu else y


def impls() -> list[Impl]:
    import opgate.ops.layer_norm.triton_impl as impl
    from opgate.ops.layer_norm import reference

    op = torch.ops.opgate.layer_norm.default
    out: list[Impl] = [
        ("opgate triton", op),
        ("opgate triton, compiled", torch.compile(op)),
        ("aten F.layer_norm (+F.gelu)", _aten),
        ("compile(reference)", torch.compile(reference.layer_norm)),
    ]
    fn = liger("liger_kernel.transformers.functional", "liger_layer_norm")
    if fn is not None:

        def liger_ln(
            x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float, gelu: bool
        ) -> torch.Tensor:
            assert fn is not None
            y = fn(x, w, b, eps)
            return F.gelu(y) if gelu else y

        out.append(("liger (+F.gelu)", liger_ln))
    assert impl.OP
    return out


if __name__ == "__main__":
    sys.exit(main("layer_norm", "8x4096x0,4096x4096x0,32768x8192x0,32768x8192x1", problems, impls))
