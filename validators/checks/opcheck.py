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

test_schema's aliasing test compares outputs with ``torch._C._overlaps``; on
the H200 image (torch 2.11, CUDA) two distinct *empty* outputs both have data
pointer 0 and are reported as aliases ("Outputs 0 and 1 alias unexpectedly"):
every zero-size cell of a correct two-output op failed.  Outputs that hold no
elements cannot share memory, so that report is re-examined on the op's real
outputs (:func:`empty_alias`) and passes with a note; any other alias stands.
"""

from __future__ import annotations

import re
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


_ALIAS = re.compile(r"Outputs (\d+) and (\d+) alias unexpectedly")


def empty_alias(op: Any, sample: Any, exc: BaseException) -> str | None:
    """Why test_schema's "Outputs i and j alias" is no alias (both distinct, one empty), or None."""
    found = _ALIAS.search(str(exc))
    if found is None:
        return None
    i, j = int(found.group(1)), int(found.group(2))
    with torch.no_grad():
        out = op(*sample.args, **sample.kwargs)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    if max(i, j) >= len(outs):
        return None
    a, b = outs[i], outs[j]
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a is b:
        return None
    if a.numel() and b.numel():
        return None
    return (
        f"test_schema reported outputs {i} and {j} as aliases; they are distinct tensors and "
        f"hold no elements (shapes {tuple(a.shape)} and {tuple(b.shape)}, data pointers "
        f"{a.data_ptr()} and {b.data_ptr()}): nothing to share, not an alias"
    )


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
            note = empty_alias(op, sample, outcome) if subtest == "test_schema" else None
            if note is not None:
                return CheckResult(name, Verdict.PASS, f"{subtest} passed ({note})")
            return CheckResult(
                name,
                Verdict.FAIL,
                f"{subtest} failed: {describe_exception(outcome)}",
                {"exception": type(outcome).__name__, "message": str(outcome)[:4000]},
            )
        return CheckResult(name, Verdict.ERROR, f"{subtest}: opcheck returned {outcome!r}")

    return run


CHECKS = tuple(Check(f"opcheck:{t}", applies, _runner(t)) for t in SUBTESTS)
