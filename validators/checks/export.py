"""export: ``torch.export.export`` must keep the op as one node of the graph, also once lowered.

An op that exports by being traced *through* (a Python function around aten
calls) exports fine and computes the right numbers, but the deployed graph no
longer calls its kernel: that is a ``fallback``, listing what the graph holds
instead.  ``torch.export`` keeps a CompositeImplicitAutograd op as a node, and
``ep.run_decompositions()`` (the form AOTInductor and ExecuTorch lower)
decomposes it: so the node must be in both graphs.  The op is exported inside
its graph (:mod:`validators.checks.opgraph`); the programs' numbers are judged
by the mode's correctness check and what they run by the evidence check.
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
    if ctx.artifact.failure is not None:
        return f"not exported: {ctx.artifact.failure}"
    return None


def _missing(qual: str, ops: list[str], what: str) -> str:
    held = ", ".join(dict.fromkeys(ops)) or "no operator"
    return f"{what} does not call {qual}; the graph holds: {held}"


def check_graphs(ctx: CellContext, name: str) -> CheckResult:
    """Export every shape; the op's qualname must appear in each graph, before and after decomposition."""
    artifact = ctx.artifact
    assert isinstance(artifact, Exported)
    qual = ctx.impl.qualname.split(".", 1)[0] if ctx.impl.qualname else None
    graphs: list[dict[str, Any]] = []
    for shape, sample in zip(ctx.shapes, ctx.inputs(), strict=True):
        try:
            ep = artifact.program(sample)
            lowered = artifact.decomposed(sample)
        except ArtifactError as exc:
            return CheckResult(name, Verdict.FAIL, str(exc), {"shape": list(shape), "graphs": graphs})
        ops, lowered_ops = graph_ops(ep), graph_ops(lowered)
        graphs.append({"shape": list(shape), "ops": ops, "decomposed_ops": lowered_ops})
        if qual is None:
            continue
        if qual not in ops:
            problem = _missing(qual, ops, "exported graph") + " (the op was traced through)"
        elif qual not in lowered_ops:
            problem = (
                _missing(
                    qual,
                    lowered_ops,
                    "after run_decompositions() (what AOTInductor and ExecuTorch lower) the graph",
                )
                + " (a CompositeImplicitAutograd kernel decomposed it)"
            )
        else:
            continue
        return CheckResult(name, Verdict.FALLBACK, problem, {"graphs": graphs})
    what = f"keeps {qual}, also after run_decompositions()" if qual else "exported (no qualname to look for)"
    return CheckResult(
        name, Verdict.PASS, f"{len(graphs)} shape(s) exported, graph {what}", {"graphs": graphs}
    )


def run(ctx: CellContext) -> CheckResult:
    return check_graphs(ctx, NAME)


CHECKS = (Check(NAME, applies, run),)
