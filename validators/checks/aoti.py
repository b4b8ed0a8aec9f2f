"""aoti: AOTInductor package + load + run, in this worker process.

The package is compiled from the exported program into the cell's work
directory, loaded back with ``aoti_load_package`` and run; its numbers are
judged by the mode's correctness check.  Loading a package that holds a Python
custom op segfaulted on the H200 machine: that kills this worker, and the
runner, which runs every cell in an isolated process, records the signal as
the cell's ``error``.  The exported graph must still call the op (as in the
export check): a package whose graph was traced through the op ships without
its kernel.  The evidence check then profiles a warm call of the loaded
package, so the kernel names judged are those the deployed artifact runs
(a package may run the op's kernel embedded, or call back into the
registered op through AOTInductor's proxy executor: either way the op's own
kernel must show, and no decomposition of it).
"""

from __future__ import annotations

from opgate.validators.checks.artifacts import Aoti, ArtifactError
from opgate.validators.checks.base import Check
from opgate.validators.checks.context import CellContext
from opgate.validators.checks.export import check_graphs
from opgate.validators.result import CheckResult, Verdict

NAME = "aoti"


def applies(ctx: CellContext) -> str | None:
    if not isinstance(ctx.artifact, Aoti):
        return f"mode {ctx.mode} does not package with AOTInductor"
    return None


def run(ctx: CellContext) -> CheckResult:
    artifact = ctx.artifact
    assert isinstance(artifact, Aoti)
    graph = check_graphs(ctx, NAME)
    if graph.status is not Verdict.PASS:
        return graph
    try:
        for sample in ctx.inputs():
            artifact.runner(sample)
    except ArtifactError as exc:
        return CheckResult(NAME, Verdict.FAIL, str(exc), graph.details)
    return CheckResult(
        NAME,
        Verdict.PASS,
        f"{len(artifact.packages)} package(s) compiled and loaded",
        {"packages": sorted(artifact.packages.values()), **graph.details},
    )


CHECKS = (Check(NAME, applies, run),)
