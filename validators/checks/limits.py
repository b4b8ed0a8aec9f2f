"""limits: a cell the spec declares unsupported must be refused with a clear error.

The declaration is a promise to users ("this raises"), so it is checked like
any other claim, on the cell's own inputs and through the mode's artifact:

* the op raises with a message          -> ``unsupported`` (the message is the reason)
* it raises with an empty message       -> ``fail``: not a clear error
* it returns numbers within tolerance   -> ``fail``: declared unsupported but works, drop the declaration
* it returns wrong numbers              -> ``fail``: silently wrong where it promised to refuse

Only this check runs in a declared-unsupported cell: the other checks would
just re-discover the refusal.
"""

from __future__ import annotations

from typing import Any

from opgate.validators.checks.artifacts import ArtifactError
from opgate.validators.checks.base import Check, describe_exception
from opgate.validators.checks.context import CellContext, call
from opgate.validators.checks.oracle import oracle
from opgate.validators.result import CheckResult, Verdict
from opgate.validators.tolerance import compare

NAME = "limits"


def applies(ctx: CellContext) -> str | None:
    if ctx.impl.unsupported_reason(ctx.cell.id) is None:
        return "the spec does not declare this cell unsupported"
    return None


def run(ctx: CellContext) -> CheckResult:
    artifact = ctx.artifact
    assert artifact is not None
    declared = ctx.impl.unsupported_reason(ctx.cell.id)
    sample, ref_sample = ctx.inputs()[0], ctx.inputs()[0]
    details: dict[str, Any] = {"declared": declared, "seed": ctx.seed}
    try:
        out = artifact(sample)
    except ArtifactError as exc:
        details["raised"] = str(exc)
        return CheckResult(
            NAME, Verdict.UNSUPPORTED, f"refused while building the {artifact.mode} artifact: {exc}", details
        )
    except Exception as exc:  # noqa: BLE001 - the refusal itself is what this check looks for
        message = describe_exception(exc)
        details["raised"] = message
        if not str(exc).strip():
            return CheckResult(
                NAME, Verdict.FAIL, f"refused without a message ({type(exc).__name__})", details
            )
        return CheckResult(NAME, Verdict.UNSUPPORTED, message, details)
    ref = call(ctx.reference, ref_sample)
    comparisons = compare(out, ref, oracle(ctx.reference, ref_sample), ctx.rule)
    details["comparisons"] = [c.details() for c in comparisons]
    if all(c.passed for c in comparisons):
        return CheckResult(
            NAME, Verdict.FAIL, f"declared unsupported ({declared}) but works: drop the declaration", details
        )
    bad = next(c for c in comparisons if not c.passed)
    return CheckResult(
        NAME,
        Verdict.FAIL,
        f"declared unsupported ({declared}) but returned silently wrong numbers: {bad.summary()}",
        details,
    )


CHECKS = (Check(NAME, applies, run),)
