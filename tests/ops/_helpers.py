"""Layouts, comparison rule and autograd helpers shared by the direct op tests.

The layouts are built here independently of the validators, so these tests
check the kernels' stride handling on their own.  The comparison rule is the
validators' rule: the op's error against the float64 oracle must stay within
k x the reference's own error in the same dtype, floored for tiny outputs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

#: Where the tests run: "cpu" (Triton interpreter, the default) or "cuda" (real kernels).
DEVICE = os.environ.get("OPGATE_TEST_DEVICE", "cpu")
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
LAYOUTS = ("contiguous", "transposed", "strided", "offset", "misaligned", "broadcast")


def with_layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    """The same values as ``t`` (``broadcast``: row 0 repeated) in the given memory layout."""
    if layout == "contiguous" or t.dim() == 0:
        return t.clone()
    if layout == "transposed":
        perm = list(range(t.dim()))[::-1]  # reverse every dim: last dim no longer unit-stride
        return t.permute(perm).contiguous().permute(perm)
    if layout == "strided":
        buf = torch.full((*t.shape[:-1], 2 * t.shape[-1]), float("nan"), dtype=t.dtype, device=t.device)
        view = buf[..., ::2]
        view.copy_(t)
        return view
    if layout in ("offset", "misaligned"):
        off = 1 if layout == "misaligned" else 37
        buf = torch.full((t.numel() + off + 3,), float("nan"), dtype=t.dtype, device=t.device)
        view = buf[off : off + t.numel()].view(t.shape)
        view.copy_(t)
        assert view.storage_offset() == off
        return view
    if layout == "broadcast":
        return t[:1].expand(t.shape) if t.shape[0] > 0 else t.clone()
    raise ValueError(f"unknown layout {layout}")


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.numel() == 0:
        return 0.0
    return float((a.double() - b.double()).abs().max())


def assert_close_rule(
    name: str, out: torch.Tensor, ref_lowp: torch.Tensor, oracle: torch.Tensor, *, k: float, floor: float
) -> None:
    """Fail unless max|out - oracle| <= k * max(max|ref_lowp - oracle|, floor) and out has no new NaN/Inf.

    The validators' rule (validators/tolerance.py), restated here so these tests stand alone.
    """
    assert out.shape == oracle.shape, f"{name}: shape {tuple(out.shape)} != {tuple(oracle.shape)}"
    assert out.dtype == ref_lowp.dtype, f"{name}: dtype {out.dtype} != {ref_lowp.dtype}"
    bad = ~torch.isfinite(out.double()) & torch.isfinite(oracle)
    assert not bool(bad.any()), f"{name}: {int(bad.sum())} non-finite values where the oracle is finite"
    e_op, e_ref = max_err(out, oracle), max_err(ref_lowp, oracle)
    bound = k * max(e_ref, floor)
    assert e_op <= bound, f"{name}: error {e_op:.3e} > bound {bound:.3e} (reference error {e_ref:.3e})"


def run_with_grads(
    fn: Callable[..., Any],
    args: Sequence[Any],
    kwargs: dict[str, Any],
    grad_args: Sequence[int],
    cotangents: Sequence[torch.Tensor] | None,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Outputs of ``fn`` and, when ``cotangents`` are given, the gradients of ``grad_args``."""
    args = list(args)
    for i in grad_args:
        args[i] = args[i].detach().requires_grad_(True)
    out = fn(*args, **kwargs)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    if not grad_args or cotangents is None:
        return [o.detach() for o in outs], []
    cots = [c.to(o.dtype) for c, o in zip(cotangents, outs, strict=True)]
    grads = torch.autograd.grad(outs, [args[i] for i in grad_args], cots, allow_unused=True)
    return [o.detach() for o in outs], [
        g if g is not None else torch.zeros_like(args[i]) for g, i in zip(grads, grad_args, strict=True)
    ]


def compare_op(
    op: Callable[..., Any],
    ref: Callable[..., Any],
    args: Sequence[Any],
    kwargs: dict[str, Any],
    grad_args: Sequence[int],
    *,
    backward: bool,
    k: float = 2.0,
    floor: float = 1e-5,
    seed: int = 0,
) -> None:
    """Op vs reference in the same dtype vs the reference in float64 (outputs and, optionally, grads)."""
    args64 = [a.detach().double() if isinstance(a, torch.Tensor) else a for a in args]
    gargs = tuple(grad_args) if backward else ()
    with torch.no_grad():
        shapes, _ = run_with_grads(ref, args, kwargs, (), None)
    gen = torch.Generator().manual_seed(seed)
    cots = (
        [torch.randn(o.shape, generator=gen).to(device=o.device, dtype=o.dtype) for o in shapes]
        if backward
        else None
    )
    o_op, g_op = run_with_grads(op, args, kwargs, gargs, cots)
    o_ref, g_ref = run_with_grads(ref, args, kwargs, gargs, cots)
    o_64, g_64 = run_with_grads(ref, args64, kwargs, gargs, cots)
    for i, (a, b, c) in enumerate(zip(o_op, o_ref, o_64, strict=True)):
        assert_close_rule(f"output {i}", a, b, c, k=k, floor=floor)
    for i, a, b, c in zip(gargs, g_op, g_ref, g_64, strict=True):
        assert_close_rule(f"grad of arg {i}", a, b, c, k=k, floor=floor)
