"""evidence: the profiler must show the op's own kernel, and no hidden copies.

opcheck and ``torch._dynamo.explain`` both pass an op whose kernel vanishes
under compile (measured on the H200), so only the run itself is evidence.  A
*warm* call of the mode's artifact (compiled already, caches hot) is profiled,
and the spec's patterns are matched against what ran: on CPU the dispatcher's
op events (``opgate::rms_norm``), on CUDA the GPU kernel names.

* every ``expect`` pattern must match and no ``forbid`` pattern may match,
  else ``fallback``, listing what ran instead;
* a trace with no events at all is an ``error`` (the profiler is broken), never
  a pass; on CUDA a trace without a single kernel is one too, unless the input
  is empty;
* an empty input (zero-size batch) need launch nothing, and library ops skip
  their kernels for it: ``expect`` is waived there, ``forbid`` and copies still
  apply;
* hidden copies: layout copies in the op's trace beyond those in the
  reference's trace on the same inputs (see
  :meth:`validators.profiling.Trace.copies`); more than ``copies_allowed`` is
  a ``fallback`` listing them.  Liger's RMSNorm on ``x[:, ::2]`` is the
  measured example: its kernel plus an extra elementwise copy.  In compile
  mode, the copy Inductor makes to realign a misaligned graph input is told
  apart (:func:`realignment_copies`) and reported as ``realigned_inputs``.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from opgate.ops.base import SampleInput
from opgate.validators.checks.base import Check
from opgate.validators.checks.context import CellContext, call
from opgate.validators.profiling import executed_custom_ops, match, matches, profile_call
from opgate.validators.result import CheckResult, Verdict

NAME = "evidence"
#: Base-pointer alignment Inductor assumes for graph inputs it compiled as aligned.
ALIGN_BYTES = 16
#: ``aoti``: a warm call of the *loaded package* is profiled, the run a deployment makes.
MODES = ("eager", "compile", "aoti")
#: torch.compile's own bookkeeping events: matched like any name, but left out of the reported
#: kernel list (they carry graph hashes that differ between environments and say nothing of the op).
WRAPPER_EVENTS = (
    "## *",
    "TorchDynamo Cache Lookup",
    "Torch-Compiled Region*",
    "Pregraph bytecode",
    "AOTDispatcher Runtime Wrapper*",
)
#: Kernels opgate itself launches: output poisoning (deterministic ``fill_uninitialized_memory``)
#: fills every fresh allocation with NaN.  They are instrumentation, not the op's work, so they
#: neither satisfy ``expect`` nor trip ``forbid`` (a spec forbidding ``*elementwise_kernel*`` to
#: catch copy kernels would otherwise flag every cell on CUDA).
INSTRUMENTATION_KERNELS = ("*FillFunctor*",)


def is_empty(sample: SampleInput) -> bool:
    """All layout-receiving tensors are empty (a zero-size batch): a kernel need not launch."""
    targets = [sample.args[i] for i in sample.layout_args if isinstance(sample.args[i], torch.Tensor)]
    return bool(targets) and all(t.numel() == 0 for t in targets)


def applies(ctx: CellContext) -> str | None:
    if ctx.mode not in MODES:
        return f"no kernel evidence is collected in mode {ctx.mode}"
    if ctx.artifact is not None and ctx.artifact.failure is not None:
        return f"no {ctx.artifact.mode} artifact to profile ({ctx.artifact.failure})"
    rule = ctx.impl.evidence_for(ctx.device_kind, ctx.mode)
    if not rule.expect and not rule.forbid:
        return f"the spec declares no {ctx.device_kind} evidence for mode {ctx.mode}"
    return None


_COPY_LINE = re.compile(r"^aten::copy_ \S+\[(\d+)\] <- \S+\[(\d+)\]")


def misaligned_spans(sample: SampleInput, gpu_only: bool = True) -> list[int]:
    """Storage spans (elements) of the sample's tensors whose base pointer is not 16-byte aligned.

    Only GPU inputs count by default: Inductor realigns inputs on GPUs alone.
    """
    return [
        sum((n - 1) * st for n, st in zip(t.shape, t.stride(), strict=True)) + 1
        for t in (*sample.args, *sample.kwargs.values())
        if isinstance(t, torch.Tensor)
        and (t.is_cuda or not gpu_only)
        and t.numel()
        and t.data_ptr() % ALIGN_BYTES
    ]


def realignment_copies(copies: list[str], spans: list[int]) -> list[str]:
    """The copies Inductor makes to realign misaligned graph inputs, one per such input at most.

    A graph compiled (or served from Inductor's FX graph cache) for 16-byte
    aligned inputs copies a misaligned one before anything runs
    (``copy_if_misaligned`` / ``clone_preserve_strides``): a 1-d copy of the
    input's whole storage span.  The op never sees it and cannot avoid it,
    so it is reported as the compile path's cost, not as a copy the op hides.
    """
    left, found = list(spans), []
    for line in copies:
        m = _COPY_LINE.match(line)
        if m and m.group(1) == m.group(2) and int(m.group(1)) in left:
            left.remove(int(m.group(1)))
            found.append(line)
    return found


def run(ctx: CellContext) -> CheckResult:
    artifact = ctx.artifact
    assert artifact is not None
    kind = ctx.device_kind
    rule = ctx.impl.evidence_for(kind, ctx.mode)
    sample = ctx.inputs()[0]
    empty_input = is_empty(sample)
    artifact(sample)  # warm: compilation, autotuning and lazy init stay out of the trace
    trace, _ = profile_call(lambda: artifact(sample), kind, ctx.workdir / f"trace-{ctx.mode}-op.json")
    if trace.empty:
        return CheckResult(NAME, Verdict.ERROR, "profiler recorded no events", {"trace": str(trace.path)})
    if kind == "cuda" and not trace.kernels and not empty_input:
        return CheckResult(
            NAME,
            Verdict.ERROR,
            "profiler recorded no GPU kernel for a non-empty input (CUPTI unavailable?)",
            {"trace": str(trace.path), "host_events": trace.names("cpu")[:50]},
        )
    seen = [n for n in trace.names(kind) if not any(matches(n, p) for p in INSTRUMENTATION_KERNELS)]
    if kind == "cpu" and ctx.impl.qualname:
        # The op's own body ran, in eager and inside the compiled program (see executed_custom_ops):
        # torch 2.14's CPU profiler records no event for a custom op whose arguments are all tensors.
        witnessed = executed_custom_ops(lambda: artifact(sample), [ctx.impl.qualname])
        seen += [n for n in witnessed if n not in seen]
    ran = [n for n in seen if not any(matches(n, p) for p in WRAPPER_EVENTS)]
    ctx.kernels = ran
    expect_hits = match(seen, rule.expect)
    missing = [] if empty_input else [p for p, hits in expect_hits.items() if not hits]
    forbidden = {p: hits for p, hits in match(seen, rule.forbid).items() if hits}

    ref_sample = ctx.inputs()[0]
    call(ctx.reference, ref_sample)
    ref_trace, _ = profile_call(
        lambda: call(ctx.reference, ref_sample), kind, ctx.workdir / f"trace-{ctx.mode}-reference.json"
    )
    op_copies, ref_copies = trace.copies(), ref_trace.copies()
    realigned = realignment_copies(op_copies, misaligned_spans(sample)) if ctx.mode == "compile" else []
    extra = max(0, len(op_copies) - len(realigned) - len(ref_copies))
    details: dict[str, Any] = {
        "device_kind": kind,
        "mode": ctx.mode,
        "seen": seen,
        "expect": list(rule.expect),
        "forbid": list(rule.forbid),
        "missing": missing,
        "forbidden": forbidden,
        "copies": op_copies,
        "reference_copies": ref_copies,
        "realigned_inputs": realigned,
        "extra_copies": extra,
        "copies_allowed": ctx.copies_allowed,
        "empty_input": empty_input,
        "trace": str(trace.path),
    }
    problems = []
    if missing:
        problems.append(f"expected {', '.join(missing)} did not run")
    if forbidden:
        problems.append(
            "forbidden ran: " + ", ".join(sorted({n for hits in forbidden.values() for n in hits}))
        )
    if extra > ctx.copies_allowed:
        problems.append(
            f"{extra} hidden cop{'y' if extra == 1 else 'ies'} (allowed {ctx.copies_allowed}): "
            + "; ".join(op_copies)
        )
    if problems:
        listing = ", ".join(ran[:12]) + (" ..." if len(ran) > 12 else "")
        return CheckResult(NAME, Verdict.FALLBACK, "; ".join(problems) + f" (ran: {listing})", details)
    hits = sorted({n for h in expect_hits.values() for n in h})
    note = f"; Inductor realigned {len(realigned)} misaligned input(s) before it" if realigned else ""
    return CheckResult(NAME, Verdict.PASS, f"ran {', '.join(hits) or 'no forbidden kernel'}{note}", details)


CHECKS = (Check(NAME, applies, run),)
