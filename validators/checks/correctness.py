"""Correctness: the op (as the cell's mode runs it) against the reference and a float64 oracle.

Every shape of the cell's shape set is checked with fresh random inputs drawn
from the recorded seed, in the cell's layout.  Output buffers are poisoned
before the op runs (:func:`validators.checks.cell.poisoned_allocations` makes
every ``torch.empty`` return NaN-filled memory for the whole cell), so an
element the op never writes surfaces as a NaN where the oracle is finite.  The
rule itself is in :mod:`validators.tolerance`.
"""

from __future__ import annotations

from typing import Any

import torch

from opgate.ops.base import SampleInput
from opgate.validators.checks.artifacts import ArtifactError
from opgate.validators.checks.base import Check
from opgate.validators.checks.context import CellContext, call
from opgate.validators.checks.oracle import oracle
from opgate.validators.layouts import describe
from opgate.validators.result import CheckResult, Verdict
from opgate.validators.tolerance import Comparison, compare

NAME = "correctness"


def _shape(sample: SampleInput, shape: tuple[int, ...]) -> list[int]:
    """The shape the op really saw (zero-size layouts change the spec's shape)."""
    first = next(
        (sample.args[i] for i in sample.layout_args if isinstance(sample.args[i], torch.Tensor)), None
    )
    return list(first.shape) if first is not None else list(shape)


def applies(ctx: CellContext) -> str | None:
    if ctx.artifact is not None and ctx.artifact.failure is not None:
        return f"no {ctx.artifact.mode} artifact to check ({ctx.artifact.failure})"
    return None


def summarize(comparisons: list[Comparison], what: str) -> tuple[Verdict, str]:
    """PASS/FAIL and one line: the first failure, else the worst relative error."""
    failed = [c for c in comparisons if not c.passed]
    if failed:
        more = f" (+{len(failed) - 1} more)" if len(failed) > 1 else ""
        return Verdict.FAIL, failed[0].summary() + more
    if not comparisons:
        return Verdict.PASS, f"{what}: nothing to compare"
    worst = max(comparisons, key=lambda c: c.margin)
    line = f"{what} within tolerance; worst {worst.summary()}"
    flagged = [c.label for c in comparisons if c.baseline_worse]
    if flagged:
        line += f"; baseline worse than op at {', '.join(flagged)}"
    return Verdict.PASS, line


def run(ctx: CellContext) -> CheckResult:
    artifact = ctx.artifact
    assert artifact is not None
    comparisons: list[Comparison] = []
    layouts: list[list[str]] = []
    op_inputs, ref_inputs = ctx.inputs(), ctx.inputs()
    for shape, sample, ref_sample in zip(ctx.shapes, op_inputs, ref_inputs, strict=True):
        layouts.append([describe(a) for a in sample.tensors()])
        try:
            out: Any = artifact(sample)
        except ArtifactError as exc:
            return CheckResult(NAME, Verdict.SKIP, f"no {artifact.mode} artifact for shape {shape} ({exc})")
        ref = call(ctx.reference, ref_sample)
        exact = oracle(ctx.reference, ref_sample)
        comparisons += compare(out, ref, exact, ctx.rule, label=f"shape {_shape(sample, shape)}")
    status, summary = summarize(comparisons, "outputs")
    details: dict[str, Any] = {
        "seed": ctx.seed,
        "mode": ctx.mode,
        "layout": ctx.cell.layout,
        "inputs": layouts,
        "rule": ctx.rule.to_json(),
        "comparisons": [c.details() for c in comparisons],
        "baseline_worse": any(c.baseline_worse for c in comparisons),
    }
    return CheckResult(NAME, status, summary, details)


CHECKS = (Check(NAME, applies, run),)
