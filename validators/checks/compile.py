"""compile: the op under ``torch.compile(fullgraph=True)``, graphs and recompiles counted.

What is compiled is the op inside a small graph, a producer of its inputs and
a consumer of its outputs (:mod:`validators.checks.opgraph`), as in a model.
The cell's shared compiled function is called once per shape of the shape set
(in the cell's layout), reading Dynamo's own counters around each call:

* ``fullgraph`` must compile: a graph break raises, and the check fails with
  the reason.  The number of breaks is then measured with a plain
  (non-fullgraph) compile, for the report.
* recompiles: graphs added by the 2nd.. shapes.  When the spec declares
  ``dynamic_shapes`` the function is compiled ``dynamic=True``, and a new graph
  for a shape whose :func:`signature` an earlier shape already had fails the
  check.  Shapes with a new signature may legitimately recompile (sizes 0 and 1
  are always specialized, non-tensor arguments are guarded as constants); they
  are counted but not judged.  Without ``dynamic_shapes`` nothing is judged.

This check runs before the mode's correctness and evidence checks, which
reuse the compiled function (no further compilation happens there).
"""

from __future__ import annotations

from typing import Any

import torch

from opgate.ops.base import SampleInput
from opgate.validators.checks.artifacts import ArtifactError, Compiled
from opgate.validators.checks.base import Check, describe_exception
from opgate.validators.checks.context import CellContext
from opgate.validators.result import CheckResult, Verdict

NAME = "compile"


def graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def graph_breaks() -> int:
    from torch._dynamo.utils import counters

    return int(sum(counters["graph_break"].values()))


def break_reasons() -> list[str]:
    from torch._dynamo.utils import counters

    return [str(r).splitlines()[0][:300] for r in counters["graph_break"]]


def count_breaks(ctx: CellContext) -> dict[str, Any]:
    """Diagnostics after a fullgraph failure: how many breaks a plain compile of the op alone takes (and why).

    The op alone, not its graph: a break inside a called function also breaks
    the caller's frame, and the count is about the op.
    """
    before = graph_breaks()
    fn = torch.compile(ctx.op, dynamic=True if ctx.spec.dynamic_shapes else None)
    sample = ctx.inputs()[0]
    try:
        fn(*sample.args, **sample.kwargs)
    except Exception as exc:  # noqa: BLE001 - diagnostics only; the fullgraph failure is the verdict
        return {"plain_compile": describe_exception(exc), "graph_breaks": graph_breaks() - before}
    return {"plain_compile": "ran", "graph_breaks": graph_breaks() - before, "break_reasons": break_reasons()}


def signature(sample: SampleInput) -> tuple[Any, ...]:
    """What Dynamo guards on beyond symbolic sizes: ranks, dtypes, constants, which ints are 0, 1 or equal.

    Sizes, strides and storage offsets of 2 and more become symbols, but 0 and
    1 are specialized, and equal values share one symbol ("duck sizing": M ==
    storage offset in one shape and not in the next is a guard failure).  So
    every such int is replaced by the index of the first int with its value.
    Two samples with one signature must run one graph under ``dynamic=True``.
    """
    parts: list[Any] = []
    first_seen: dict[int, int] = {}

    def sym(v: int) -> Any:
        return v if v < 2 else ("s", first_seen.setdefault(v, len(first_seen)))

    values = [*sample.args, *(v for _, v in sorted(sample.kwargs.items()))]
    for a in values:
        if isinstance(a, torch.Tensor):
            ints = (*a.shape, *a.stride(), a.storage_offset())
            parts.append(("tensor", str(a.dtype), a.dim(), tuple(sym(int(v)) for v in ints)))
        else:
            parts.append(("const", repr(a)))
    return tuple(parts)


def _call(artifact: Compiled, sample: SampleInput) -> str:
    """Run the compiled function once: "" or the op's run-time error (a compile failure raises)."""
    try:
        artifact(sample)
    except ArtifactError:
        raise
    except Exception as exc:  # noqa: BLE001 - the op crashed at run time: correctness reports it
        return describe_exception(exc)
    return ""


def applies(ctx: CellContext) -> str | None:
    if not isinstance(ctx.artifact, Compiled):
        return f"mode {ctx.mode} has no compiled function"
    if ctx.artifact.failure is not None:
        return f"not compiled: {ctx.artifact.failure}"
    return None


def run(ctx: CellContext) -> CheckResult:
    artifact = ctx.artifact
    assert isinstance(artifact, Compiled)
    per_shape: list[dict[str, Any]] = []
    runtime_errors: list[str] = []
    seen: set[tuple[Any, ...]] = set()
    breaks0 = graph_breaks()
    for shape, sample in zip(ctx.shapes, ctx.inputs(), strict=True):
        sig = signature(sample)
        repeat = sig in seen
        seen.add(sig)
        before = graphs()
        try:
            error = _call(artifact, sample)
        except ArtifactError as exc:
            failed = {
                "shape": list(shape),
                "error": str(exc),
                "dynamic": artifact.dynamic,
                **count_breaks(ctx),
            }
            return CheckResult(NAME, Verdict.FAIL, f"fullgraph compile failed: {exc}", failed)
        if error:
            runtime_errors.append(f"shape {list(shape)}: {error}")
        per_shape.append({"shape": list(shape), "new_graphs": graphs() - before, "same_signature": repeat})
    recompiles = sum(s["new_graphs"] for s in per_shape[1:])
    unexpected = sum(s["new_graphs"] for s in per_shape if s["same_signature"])
    breaks = graph_breaks() - breaks0
    details: dict[str, Any] = {
        "fullgraph": True,
        "dynamic": artifact.dynamic,
        "graphs": per_shape,
        "recompiles": recompiles,
        "unexpected_recompiles": unexpected,
        "dynamic_exercised": any(s["same_signature"] for s in per_shape),
        "graph_breaks": breaks,
        "runtime_errors": runtime_errors,
    }
    if breaks:
        return CheckResult(NAME, Verdict.FAIL, f"{breaks} graph break(s) under fullgraph", details)
    if unexpected and ctx.spec.dynamic_shapes:
        return CheckResult(
            NAME,
            Verdict.FAIL,
            f"recompiled {unexpected} time(s) for new sizes although the spec declares dynamic_shapes",
            details,
        )
    note = f"; {recompiles} recompile(s) for new signatures" if recompiles else ""
    if ctx.spec.dynamic_shapes and not details["dynamic_exercised"]:
        note += "; no two shapes share a signature, dynamic shapes not exercised"
    return CheckResult(NAME, Verdict.PASS, f"fullgraph compiled, {len(per_shape)} shape(s){note}", details)


CHECKS = (Check(NAME, applies, run),)
