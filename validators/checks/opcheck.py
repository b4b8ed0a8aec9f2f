"""torch.library.opcheck, one result per sub-test.

The four sub-tests find different registration mistakes (schema vs. real
mutation/aliasing, autograd registered on the right key, a fake impl whose
sizes/strides match the real kernel, the op end to end under AOT dispatch with
dynamic shapes), so each is its own check: "opcheck failed" alone would not say
which registration to fix.  They run on the cell's own inputs (layout included,
differentiable arguments requiring grad), because a fake impl that gets strides
wrong only shows on non-contiguous inputs.

opcheck passes an op registered as CompositeImplicitAutograd whose kernel
vanishes under compile (see the H200 measurements): its success is necessary,
never sufficient; the evidence check is what catches that.
"""

from __future__ import annotations

from typing import Any

import torch

from opgate.validators.checks.base import Check, describe_exception
from opgate.validators.checks.context import CellContext, with_grad
from opgate.validators.result import CheckResult, Verdict

SUBTESTS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def lookup(qualname: str, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> Any:
    """``ns::name[.overload]`` -> the OpOverload opcheck tests.

    opcheck refuses a packet with several overloads (``.default`` and
    ``.out``): without a named overload, the one the dispatcher picks for the
    cell's own arguments is tested, as a call of the op would.
    """
    ns, _, rest = qualname.partition("::")
    name, _, overload = rest.partition(".")
    packet = getattr(getattr(torch.ops, ns), name)
    if overload:
        return getattr(packet, overload)
    overloads = packet.overloads()
    if len(overloads) <= 1:
        return packet
    chosen = torch._C._jit_resolve_packet(f"{ns}::{name}", *args, **(kwargs or {}))
    return getattr(packet, chosen or "default")


def applies(ctx: CellContext) -> str | None:
    if not ctx.impl.qualname:
        return "the implementation has no torch.library qualname (external op)"
    return None


def _runner(subtest: str) -> Any:
    def run(ctx: CellContext) -> CheckResult:
        assert ctx.impl.qualname is not None
        sample = ctx.inputs()[0]
        op = lookup(ctx.impl.qualname, sample.args, sample.kwargs)
        if torch.is_floating_point(torch.empty((), dtype=ctx.dtype)):
            sample = with_grad(sample)
        result = torch.library.opcheck(
            op, sample.args, sample.kwargs, test_utils=(subtest,), raise_exception=False
        )
        outcome = result.get(subtest)
        name = f"opcheck:{subtest}"
        if outcome == "SUCCESS":
            return CheckResult(name, Verdict.PASS, f"{subtest} passed")
        if isinstance(outcome, BaseException):
            return CheckResult(
                name,
                Verdict.FAIL,
                f"{subtest} failed: {describe_exception(outcome)}",
                {"exception": type(outcome).__name__, "message": str(outcome)[:4000]},
            )
        return CheckResult(name, Verdict.ERROR, f"{subtest}: opcheck returned {outcome!r}")

    return run


CHECKS = tuple(Check(f"opcheck:{t}", applies, _runner(t)) for t in SUBTESTS)
