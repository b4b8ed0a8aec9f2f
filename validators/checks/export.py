"""export: ``torch.export.export`` must keep the op as one node of the graph.

An op that exports by being traced *through* (a CompositeImplicitAutograd
registration, a Python function around aten calls) exports fine and computes
the right numbers, but the deployed graph no longer calls its kernel: that is a
``fallback``, listing what the graph holds instead.  The exported program's
numbers are judged by the mode's correctness check, which runs
``ExportedProgram.module()`` on the same inputs.
"""

from __future__ import annotations

from typing import Any

import torch

from opgate.validators.checks.artifacts import ArtifactError, Exported
from opgate.validators.checks.base import Check
from opgate.validators.checks.context import CellContext
from opgate.validators.result import CheckResult, Verdict

NAME = "export"


def graph_ops(ep: torch.export.ExportedProgram) -> list[str]:
    """``ns::name`` of every operator node in the exported graph, in order."""
    names = []
    for node in ep.graph.nodes:
        if node.op != "call_function":
            continue
        schema = getattr(node.target, "_schema", None)
        names.append(schema.name if schema is not None else str(node.target))
    return names


def applies(ctx: CellContext) -> str | None:
    if not isinstance(ctx.artifact, Exported):
        return f"mode {ctx.mode} does not export"
    return None


def check_graphs(ctx: CellContext, name: str) -> CheckResult:
    """Export every shape; the op's qualname must appear in each graph."""
    artifact = ctx.artifact
    assert isinstance(artifact, Exported)
    qual = ctx.impl.qualname.split(".", 1)[0] if ctx.impl.qualname else None
    graphs: list[dict[str, Any]] = []
    for shape, sample in zip(ctx.shapes, ctx.inputs(), strict=True):
        try:
            ep = artifact.program(sample)
        except ArtifactError as exc:
            return CheckResult(name, Verdict.FAIL, str(exc), {"shape": list(shape)})
        ops = graph_ops(ep)
        graphs.append({"shape": list(shape), "ops": ops})
        if qual is not None and qual not in ops:
            held = ", ".join(dict.fromkeys(ops)) or "no operator"
            return CheckResult(
                name,
                Verdict.FALLBACK,
                f"exported graph does not call {qual} (it was traced through); the graph holds: {held}",
                {"graphs": graphs},
            )
    what = f"keeps {qual}" if qual else "exported (no qualname to look for)"
    return CheckResult(
        name, Verdict.PASS, f"{len(graphs)} shape(s) exported, graph {what}", {"graphs": graphs}
    )


def run(ctx: CellContext) -> CheckResult:
    return check_graphs(ctx, NAME)


CHECKS = (Check(NAME, applies, run),)
