"""mutation: an op must not write into its inputs, nor its backward into its incoming gradients, undeclared.

Kernels written for memory savings do both: Liger's RoPE writes its result
into ``q`` and ``k``, its RMSNorm and RoPE backward write ``dx`` into the
gradient they are handed.  The numbers such an op returns are right, so the
other checks see only consequences (a wrong gradient further down the graph,
"Backward is not reentrant" from gradcheck); this check names the cause:
"forward writes into input 0 (declared functional)", "backward writes into
grad_output 0".

Every tensor argument's whole storage is snapshotted (bytes, so NaN padding
and writes just outside a strided view count too) before the op runs, and
compared after the forward and again after the backward; the upstream
gradients likewise before and after the backward.  The forward runs as the
cell's mode runs it (its artifact); the backward, in eager cells, where the
gradient checks run.

Declared writes are not flagged: arguments the torch.library schema marks
as written (``mutates_args``, ``Tensor(a!)``) and positions listed in the
spec's ``mutates: {inputs, grad_outputs}``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree

from opgate.ops.base import SampleInput
from opgate.validators.checks.artifacts import ArtifactError
from opgate.validators.checks.base import Check, describe_exception
from opgate.validators.checks.context import CellContext, with_grad
from opgate.validators.checks.gradients import upstream_grads
from opgate.validators.checks.opcheck import lookup
from opgate.validators.result import CheckResult, Verdict

NAME = "mutation"
#: Generator stream of the upstream gradients (the gradients check uses stream 1).
_STREAM = 2


@dataclass(frozen=True)
class Declared:
    """Positions the op may write: inputs in its forward, grad_outputs in its backward."""

    inputs: frozenset[int]
    grad_outputs: frozenset[int]


def schema_writes(qualname: str | None) -> frozenset[int]:
    """Argument positions the torch.library schema marks as written (``Tensor(a!)``)."""
    if not qualname:
        return frozenset()
    try:
        op = lookup(qualname)
    except (AttributeError, RuntimeError):
        return frozenset()
    if isinstance(op, torch._ops.OpOverloadPacket):
        names = op.overloads()
        op = getattr(op, "default" if "default" in names else names[0]) if names else None
    if op is None:
        return frozenset()
    return frozenset(
        i for i, a in enumerate(op._schema.arguments) if a.alias_info is not None and a.alias_info.is_write
    )


def declared(ctx: CellContext) -> Declared:
    return Declared(
        inputs=frozenset(ctx.impl.mutates.inputs) | schema_writes(ctx.impl.qualname),
        grad_outputs=frozenset(ctx.impl.mutates.grad_outputs),
    )


class Snapshot:
    """Bytes of every storage behind ``tensors`` and the values of each view, to diff later."""

    def __init__(self, tensors: Sequence[tuple[str, torch.Tensor]]) -> None:
        self.items = [(name, t, _storage_bytes(t).clone(), _bits(t).clone()) for name, t in tensors]

    def changed(self) -> list[tuple[str, str]]:
        """(which tensor, how many of its elements) for every tensor written since the snapshot."""
        found = []
        for name, t, raw, bits in self.items:
            if torch.equal(_storage_bytes(t), raw):
                continue
            n = int((_bits(t) != bits).sum())
            what = f"{n} of {t.numel()} elements changed" if n else "memory around the view changed"
            found.append((name, what))
        return found


def _storage_bytes(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The view's elements as integers of the same size (NaN == NaN, -0 != +0)."""
    t = t.detach()
    if t.dtype.is_complex or t.dtype == torch.bool or t.element_size() not in _SAME_SIZE_INT:
        return t
    return t.view(_SAME_SIZE_INT[t.element_size()])


def _tensor_args(sample: SampleInput) -> list[tuple[int | str, torch.Tensor]]:
    found: list[tuple[int | str, torch.Tensor]] = [
        (i, a) for i, a in enumerate(sample.args) if isinstance(a, torch.Tensor)
    ]
    return found + [(k, v) for k, v in sample.kwargs.items() if isinstance(v, torch.Tensor)]


def _inputs(sample: SampleInput, allowed: frozenset[int]) -> list[tuple[str, torch.Tensor]]:
    return [
        (f"input {pos}" if isinstance(pos, int) else f"input {pos!r}", t)
        for pos, t in _tensor_args(sample)
        if pos not in allowed
    ]


def _declared_text(allowed: frozenset[int], what: str) -> str:
    if not allowed:
        return "declared functional"
    return f"declared to write {what} {', '.join(map(str, sorted(allowed)))} only"


def applies(ctx: CellContext) -> str | None:
    if ctx.artifact is not None and ctx.artifact.failure is not None:
        return f"no {ctx.artifact.mode} artifact to check ({ctx.artifact.failure})"
    return None


def run(ctx: CellContext) -> CheckResult:
    artifact = ctx.artifact
    assert artifact is not None
    decl = declared(ctx)
    sample = ctx.inputs(shapes=ctx.shapes[:1])[0]
    backward = ctx.mode == "eager" and bool(sample.differentiable()) and ctx.dtype.is_floating_point
    if backward:
        sample = with_grad(sample)
    problems: list[str] = []
    details: dict[str, Any] = {
        "declared_inputs": sorted(decl.inputs),
        "declared_grad_outputs": sorted(decl.grad_outputs),
        "shape": list(ctx.shapes[0]),
        "backward_checked": False,
    }
    before = Snapshot(_inputs(sample, decl.inputs))
    try:
        out = artifact(sample)
    except ArtifactError as exc:
        return CheckResult(NAME, Verdict.SKIP, f"no {artifact.mode} artifact ({exc})")
    except Exception as exc:
        if not backward:  # an op that refuses inputs requiring grad: check its forward alone
            raise
        details["backward_note"] = f"the op refused inputs requiring grad: {describe_exception(exc)}"
        backward = False
        sample = ctx.inputs(shapes=ctx.shapes[:1])[0]
        before = Snapshot(_inputs(sample, decl.inputs))
        out = artifact(sample)
    problems += [
        f"forward writes into {w} ({_declared_text(decl.inputs, 'inputs')}): {n}" for w, n in before.changed()
    ]
    if backward:
        problems += _backward(ctx, sample, out, decl, details)
    details["problems"] = problems
    if problems:
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        return CheckResult(NAME, Verdict.FAIL, problems[0] + more, details)
    what = "inputs" + (" and grad_outputs" if details["backward_checked"] else "")
    note = f" ({details['backward_note']})" if "backward_note" in details else ""
    return CheckResult(NAME, Verdict.PASS, f"no undeclared writes into {what}{note}", details)


def _backward(
    ctx: CellContext, sample: SampleInput, out: Any, decl: Declared, details: dict[str, Any]
) -> list[str]:
    outs = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    grads = upstream_grads(out, ctx.generator(_STREAM))
    pairs = [(o, g) for o, g in zip(outs, grads, strict=True) if o.requires_grad]
    if not pairs:
        details["backward_note"] = "no output requires grad"
        return []
    leaves = [sample.args[i] for i in sample.differentiable() if isinstance(sample.args[i], torch.Tensor)]
    named = [(f"grad_output {i}", g) for i, (_, g) in enumerate(pairs) if i not in decl.grad_outputs]
    inputs = Snapshot(_inputs(sample, decl.inputs))
    grads_before = Snapshot(named)
    try:
        torch.autograd.grad([o for o, _ in pairs], leaves, [g for _, g in pairs], allow_unused=True)
    except RuntimeError as exc:  # e.g. autograd noticed the forward's write; the gradients check reports it
        details["backward_note"] = f"backward raised {describe_exception(exc)}"
        return []
    details["backward_checked"] = True
    found = [
        f"backward writes into {w} ({_declared_text(decl.grad_outputs, 'grad_outputs')}): {n}"
        for w, n in grads_before.changed()
    ]
    return found + [f"backward writes into {w}: {n}" for w, n in inputs.changed()]


CHECKS = (Check(NAME, applies, run),)
