"""gradcheck: the op's backward against finite differences of its own forward, in float64.

Complements :mod:`gradients` (which trusts the reference's autograd): here the
op is checked against itself, so a backward that is consistent with a wrong
reference still fails.  Finite differences need float64 arithmetic *inside*
the op, so the check first probes that the op's float64 forward matches the
float64 oracle to ``FP64_REL_TOL``; an op that rejects float64 (Triton paths
often do) or computes it at lower precision is recorded as ``skip`` with that
reason rather than failing on rounding noise.  The oracle is really float64
(:mod:`.oracle`), also for a reference written with ``.float()`` casts.

gradcheck calls the backward several times with the same upstream gradient
and perturbs the inputs in place; an op that writes into either (declared or
not) would make it measure its own side effects.  So the op gets a fresh copy
of every incoming gradient, and a fresh copy of each input it declares it
writes: this check judges the backward's arithmetic, :mod:`.mutation` the writes.

When fast mode finds a mismatch, torch recomputes the full slow-mode
Jacobians of every input only to print them (two forwards per input element:
seconds per cell on a GPU's host, 3-8 s under the Triton interpreter, for a
message of matrices nobody reads in a report).  The check runs without that
recomputation (:func:`_without_slow_mode_message`): the same cells fail with
the same exception and fast mode's own numbers; the reason says how to get
the Jacobians.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import torch

from opgate.ops.base import SampleInput
from opgate.validators.checks.base import Check, describe_exception
from opgate.validators.checks.context import CellContext, call
from opgate.validators.checks.mutation import declared
from opgate.validators.checks.oracle import float64_casts
from opgate.validators.layouts import LayoutError
from opgate.validators.result import CheckResult, Verdict

NAME = "gradcheck"
#: The float64 forward must match the oracle this closely (relative, normwise) to count as float64 support.
FP64_REL_TOL = 1e-9
#: Dims of the gradcheck shape are clipped to this (its cost grows with the number of inputs).
SMALL_DIM = 8


def small_shapes(ctx: CellContext) -> list[tuple[int, ...]]:
    """Candidates, in order: the spec's ``small`` shapes, then the cell's first shape with dims clipped."""
    found = [tuple(s) for s in ctx.spec.shapes.get("small", [])]
    found.append(tuple(min(d, SMALL_DIM) for d in ctx.shapes[0]))
    return list(dict.fromkeys(found))


def _float64_sample(ctx: CellContext, layout: str) -> tuple[tuple[int, ...], SampleInput] | str:
    """The first candidate shape the layout can be generated on, or why none can."""
    reasons = []
    for shape in small_shapes(ctx):
        sample = _inputs(ctx, layout, shape)
        if not isinstance(sample, str):
            return shape, sample
        reasons.append(f"{list(shape)}: {sample}")
    return f"layout {layout} cannot be generated on a small shape ({'; '.join(reasons)})"


def _inputs(ctx: CellContext, layout: str, shape: tuple[int, ...]) -> SampleInput | str:
    try:
        return ctx.inputs(layout=layout, dtype=torch.float64, shapes=[shape])[0]
    except LayoutError as exc:
        return str(exc)


def applies(ctx: CellContext) -> str | None:
    if not ctx.samples(shapes=ctx.shapes[:1])[0].differentiable():
        return "the sample inputs declare no differentiable argument (grad_args)"
    if ctx.cell.layout == "zero_size":
        return "zero-size inputs: nothing to differentiate numerically"
    return None


def _max_rel(out: Any, oracle: Any) -> float:
    """Normwise relative distance of the op's float64 output to the oracle (inf: shape/finiteness differ)."""
    outs = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    refs = [t for t in torch.utils._pytree.tree_leaves(oracle) if isinstance(t, torch.Tensor)]
    if len(outs) != len(refs):
        return float("inf")
    worst = 0.0
    for a, b in zip(outs, refs, strict=True):
        if a.shape != b.shape or not bool((torch.isfinite(a) == torch.isfinite(b)).all()):
            return float("inf")
        finite = torch.isfinite(b)
        if bool(finite.any()):
            diff = (a.double() - b.double())[finite].abs().max()
            worst = max(worst, float(diff) / (float(b[finite].abs().max()) or 1.0))
    return worst


class _FreshGrad(torch.autograd.Function):
    """Identity whose backward hands on a copy of the incoming gradient."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor) -> torch.Tensor:
        return t.clone()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g.clone()


def _fresh_grad(t: Any) -> Any:
    if isinstance(t, torch.Tensor) and t.requires_grad:
        return _FreshGrad.apply(t)
    return t


def run(ctx: CellContext) -> CheckResult:
    # gradcheck perturbs input elements in place: a stride-0 view would perturb a whole column at once.
    layout = "contiguous" if ctx.cell.layout == "broadcast" else ctx.cell.layout
    found = _float64_sample(ctx, layout)
    if isinstance(found, str):
        return CheckResult(NAME, Verdict.SKIP, found)
    shape, sample = found
    details: dict[str, Any] = {"shape": list(shape), "layout": layout, "seed": ctx.seed}
    try:
        with torch.no_grad():
            out = call(ctx.op, sample)
    except Exception as exc:  # noqa: BLE001 - any refusal of float64 is the skip reason
        return CheckResult(
            NAME, Verdict.SKIP, f"op does not run in float64: {describe_exception(exc)}", details
        )
    wide = ctx.inputs(layout=layout, dtype=torch.float64, shapes=[shape])[0]  # drawn outside the casts
    with torch.no_grad(), float64_casts():
        oracle = call(ctx.reference, wide)
    rel = _max_rel(out, oracle)
    details["fp64_rel_err"] = rel
    if not rel <= FP64_REL_TOL:
        return CheckResult(
            NAME,
            Verdict.SKIP,
            f"op is not float64-accurate (rel err {rel:.1e} vs the float64 oracle, needs <= "
            f"{FP64_REL_TOL:g}): finite differences would measure its rounding",
            details,
        )
    args = list(sample.args)
    slots = [i for i in sample.differentiable() if isinstance(args[i], torch.Tensor)]
    slots = [i for i in slots if args[i].is_floating_point()]
    leaves = tuple(args[i].detach().requires_grad_(True) for i in slots)
    written = declared(ctx).inputs

    def fn(*xs: torch.Tensor) -> Any:
        full = list(args)
        for i, x in zip(slots, xs, strict=True):
            full[i] = x.clone() if i in written else x
        full = [a.clone() if i in written and i not in slots else a for i, a in enumerate(full)]
        out = ctx.op(*full, **sample.kwargs)
        return torch.utils._pytree.tree_map(_fresh_grad, out)

    from torch.autograd.gradcheck import GradcheckError

    try:
        with _without_slow_mode_message():
            torch.autograd.gradcheck(fn, leaves, eps=1e-6, atol=1e-5, rtol=1e-3, fast_mode=True)
    except GradcheckError as exc:
        return CheckResult(NAME, Verdict.FAIL, f"gradcheck failed: {describe_exception(exc)}", details)
    return CheckResult(NAME, Verdict.PASS, f"gradcheck passed in float64 on shape {list(shape)}", details)


#: What replaces torch's slow-mode Jacobians in a fast-mode failure's message.
SLOW_MODE_NOTE = (
    " (full Jacobians not recomputed; torch.autograd.gradcheck(fn, inputs, fast_mode=False) on the "
    "repro's inputs prints them)"
)


@contextlib.contextmanager
def _without_slow_mode_message() -> Iterator[None]:
    """torch's gradcheck, minus the slow-mode recomputation it makes only for its error message."""
    module = sys.modules.get("torch.autograd.gradcheck")
    original = getattr(module, "_run_slow_mode_and_get_error", None)
    if module is None or original is None:  # another torch: its message as it comes
        yield
        return
    module._run_slow_mode_and_get_error = lambda *args, **kwargs: SLOW_MODE_NOTE  # type: ignore[attr-defined]
    try:
        yield
    finally:
        module._run_slow_mode_and_get_error = original  # type: ignore[attr-defined]


CHECKS = (Check(NAME, applies, run),)
