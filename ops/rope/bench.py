"""Benchmark opgate::rope against the eager reference, torch.compile(reference) and Liger (CUDA only).

    python -m opgate.ops.rope.bench [--shapes 1x128x32x128x1,4x4096x32x128x1,4x4096x32x128x0] [--out FILE]

Shapes are BxSxHxDxL (L = 0: (B, S, H, D); L = 1: (B, H, S, D)); k has H // 2 heads.
Bytes: read q, k and write both (forward and backward alike) plus the cos/sin tables.
Liger takes (B, H, S, D) only, so it is timed on L = 1 shapes.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from opgate.ops._bench import Impl, Problem, liger, main


def problems(shape: tuple[int, ...], dtype: torch.dtype, dname: str, device: torch.device) -> Problem:
    from opgate.ops.rope.reference import rope_tables

    b, s, h, d, code = shape
    layout = ("bshd", "bhsd")[code]
    hk = max(1, h // 2)

    def make(heads: int) -> torch.Tensor:
        dims = (b, s, heads, d) if layout == "bshd" else (b, heads, s, d)
        return torch.randn(dims, device=device, dtype=dtype)

    q, k = make(h), make(hk)
    cos, sin = rope_tables(s, d, dtype, str(device))
    esz = q.element_size()
    nbytes = 2 * (q.numel() + k.numel()) * esz + 2 * s * d * esz
    label = f"{b}x{s}x{h}x{d} {layout}"
    return Problem(label, dname, (q, k, cos, sin), (0, 1), nbytes, nbytes, kwargs={"layout": layout})


def _liger_bhsd(fn: Callable[..., Any]) -> Callable[..., Any]:
    def call(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> Any:
        if layout != "bhsd":
            raise ValueError("Liger's rope takes (B, H, S, D) only")
        return fn(q, k, cos.unsqueeze(0), sin.unsqueeze(0))

    return call


def impls() -> list[Impl]:
    import opgate.ops.rope.triton_impl as impl
    from opgate.ops.rope import reference

    op = torch.ops.opgate.rope.default
    out: list[Impl] = [
        ("opgate triton", op),
        ("opgate triton, compiled", torch.compile(op)),
        ("eager reference", reference.rope),
        ("compile(reference)", torch.compile(reference.rope)),
    ]
    fn = liger("liger_kernel.transformers.functional", "liger_rope")
    if fn is not None:
        out.append(("liger", _liger_bhsd(fn)))
    assert impl.OP
    return out


if __name__ == "__main__":
    sys.exit(main("rope", "1x128x32x128x1,4x4096x32x128x0,4x4096x32x128x1", problems, impls))
