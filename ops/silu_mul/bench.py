"""Benchmark opgate::silu_mul against aten F.silu(a) * b, torch.compile(reference) and Liger (CUDA only).

    python -m opgate.ops.silu_mul.bench [--shapes 8x14336,4096x14336,32768x8192] [--out FILE]

Bytes: forward reads a, b and writes y; backward reads dy, a, b and writes da, db.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from opgate.ops._bench import Impl, Problem, liger, main, spec_impl


def problems(shape: tuple[int, ...], dtype: torch.dtype, dname: str, device: torch.device) -> Problem:
    m, n = shape
    a = torch.randn(shape, device=device, dtype=dtype)
    b = torch.randn(shape, device=device, dtype=dtype)
    s = a.element_size()
    return Problem(f"{m}x{n}", dname, (a, b), (0, 1), 3 * m * n * s, 5 * m * n * s)


def _aten(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.silu(a) * b


def impls() -> list[Impl]:
    import opgate.ops.silu_mul.triton_impl as impl
    from opgate.ops.silu_mul import reference

    op = torch.ops.opgate.silu_mul.default
    out: list[Impl] = [
        ("opgate triton", op),
        ("opgate triton, compiled", torch.compile(op)),
        ("aten F.silu(a) * b", _aten),
        ("compile(reference)", torch.compile(reference.silu_mul)),
    ]
    native = spec_impl("silu_mul", "cuda")
    if native is not None:
        out.insert(1, ("opgate cuda", native))
    fn = liger("liger_kernel.transformers.functional", "liger_swiglu")
    if fn is not None:
        out.append(("liger", fn))
    assert impl.OP
    return out


if __name__ == "__main__":
    sys.exit(main("silu_mul", "8x14336,4096x14336,32768x8192", problems, impls))
