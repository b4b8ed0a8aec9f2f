"""Gradients: the op's backward against the reference's autograd, by the same tolerance rule.

For every shape, the op, the reference (same dtype) and the float64 oracle are
differentiated with the same random upstream gradient (drawn from the cell's
seed, stream 1) with respect to every ``grad_args`` input, in the cell's layout.
Each backward gets its own copy of the upstream gradient: a backward that
writes into its incoming gradient (Liger's RoPE and RMSNorm do, to save
memory) must not change what the next one is handed; the mutation check
reports such writes by name.  An op whose output does not require grad (no
autograd registered) fails: the spec says the argument is differentiable.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import _pytree as pytree

from opgate.ops.base import SampleInput
from opgate.validators.checks.base import NO_BACKWARD_HINT, Check
from opgate.validators.checks.context import CellContext, call, upcast, with_grad
from opgate.validators.checks.correctness import summarize
from opgate.validators.checks.oracle import float64_casts
from opgate.validators.result import CheckResult
from opgate.validators.tolerance import Comparison, compare_tensor

NAME = "gradients"


def applies(ctx: CellContext) -> str | None:
    if not ctx.samples(shapes=ctx.shapes[:1])[0].differentiable():
        return "the sample inputs declare no differentiable argument (grad_args)"
    return None


def upstream_grads(out: Any, gen: torch.Generator) -> list[torch.Tensor]:
    """One random upstream gradient per floating output leaf (float32 draws, cast to the leaf's dtype)."""
    grads = []
    for leaf in pytree.tree_leaves(out):
        if isinstance(leaf, torch.Tensor) and leaf.is_floating_point():
            g = torch.randn(tuple(leaf.shape), generator=gen, dtype=torch.float32)
            grads.append(g.to(device=leaf.device, dtype=leaf.dtype))
    return grads


def _grads(fn: Any, sample: SampleInput, upstream: list[torch.Tensor]) -> list[torch.Tensor | None]:
    """d(sum <out_i, g_i>)/d(grad_args), in ``grad_args`` order (None where no gradient flows)."""
    out = call(fn, sample)
    outs = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    inputs = [sample.args[i] for i in sample.differentiable()]
    pairs = [(o, g.to(o.dtype, copy=True)) for o, g in zip(outs, upstream, strict=True) if o.requires_grad]
    if not pairs:
        return [None] * len(inputs)
    return list(torch.autograd.grad([o for o, _ in pairs], inputs, [g for _, g in pairs], allow_unused=True))


def run(ctx: CellContext) -> CheckResult:
    comparisons: list[Comparison] = []
    gen = ctx.generator(1)
    for shape, op_s, ref_s in zip(ctx.shapes, ctx.inputs(), ctx.inputs(), strict=True):
        op_sample, ref_sample = with_grad(op_s), with_grad(ref_s)
        oracle_sample = with_grad(upcast(ref_s))
        with torch.no_grad():
            upstream = upstream_grads(call(ctx.reference, ref_s), gen)
        g_op = _grads(ctx.op, op_sample, upstream)
        g_ref = _grads(ctx.reference, ref_sample, upstream)
        with float64_casts():
            g_oracle = _grads(ctx.reference, oracle_sample, [g.double() for g in upstream])
        for pos, a, b, c in zip(op_sample.differentiable(), g_op, g_ref, g_oracle, strict=True):
            label = f"shape {list(shape)} d/darg{pos}"
            if a is None and c is not None:
                problem = f"the op returned no gradient ({NO_BACKWARD_HINT})"
                comparisons.append(Comparison(label, False, 0.0, 0.0, 0.0, 0.0, problem=problem))
            elif c is not None:
                comparisons.append(compare_tensor(a, b, c, ctx.rule, label))
    status, summary = summarize(comparisons, "gradients")
    details = {
        "seed": ctx.seed,
        "rule": ctx.rule.to_json(),
        "comparisons": [c.details() for c in comparisons],
        "baseline_worse": any(c.baseline_worse for c in comparisons),
    }
    return CheckResult(NAME, status, summary, details)


CHECKS = (Check(NAME, applies, run),)
