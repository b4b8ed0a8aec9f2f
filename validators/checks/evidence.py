"""evidence: the profiler must show the op's own kernel, and no hidden copies, in every mode.

opcheck and ``torch._dynamo.explain`` both pass an op whose kernel vanishes
under compile (measured on the H200), so only the run itself is evidence.  A
*warm* call of the mode's artifact (compiled already, caches hot) is profiled,
and the spec's patterns are matched against what ran: on CPU the dispatcher's
op events (``opgate::rms_norm``), on CUDA the GPU kernel names.  What each mode
profiles (:mod:`validators.checks.observe`):

* eager, compile, aoti: the call;
* cudagraphs: the graph replay, i.e. the kernels the captured graph ran; a
  call that replays no graph is a ``fallback``;
* export: ``ep.module()`` *and* the program after ``ep.run_decompositions()``
  (what AOTInductor and ExecuTorch lower): each must show the op's kernel.

Then, for each profiled program:

* every ``expect`` pattern must match and no ``forbid`` pattern may match,
  else ``fallback``, listing what ran instead;
* a trace with no events at all is an ``error`` (the profiler is broken), never
  a pass; on CUDA a trace without a single kernel is one too, unless the input
  is empty;
* an empty input (zero-size batch) waives ``expect`` only where the op
  genuinely launched nothing (CUDA: no kernel, Inductor's generated ones aside in
  compiled modes; CPU: no op event beyond allocations and views) and says so;
  where anything ran, ``expect`` applies;
  ``forbid`` and copies always do;
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

from opgate.matrix.modes import MODES as ALL_MODES
from opgate.ops.base import SampleInput
from opgate.validators.checks.base import Check
from opgate.validators.checks.context import CellContext, call
from opgate.validators.checks.observe import Observed, ProfilerBroken, observe_mode
from opgate.validators.profiling import match, matches, profile_call
from opgate.validators.result import CheckResult, Verdict

NAME = "evidence"
#: Base-pointer alignment Inductor assumes for graph inputs it compiled as aligned.
ALIGN_BYTES = 16
#: ``aoti``: a warm call of the *loaded package* is profiled, the run a deployment makes.
#: Modes that collect kernel evidence (their checks include this one: :mod:`opgate.matrix.modes`).
MODES = tuple(name for name, m in ALL_MODES.items() if NAME in m.checks)
#: CPU op events that allocate or view and compute nothing: on an empty input, a trace of only
#: these (and the mode's wrappers) means the op launched nothing, so ``expect`` is waived.
BOOKKEEPING_EVENTS = (
    "aten::empty*", "aten::new_empty*", "aten::zeros*", "aten::new_zeros", "aten::zero_", "aten::fill_",
    "aten::view", "aten::_unsafe_view", "aten::reshape", "aten::_reshape_alias", "aten::as_strided",
    "aten::t", "aten::transpose", "aten::permute", "aten::expand", "aten::slice", "aten::select",
    "aten::narrow", "aten::unsqueeze", "aten::squeeze", "aten::alias", "aten::detach", "detach",
    "aten::lift_fresh", "aten::contiguous", "aten::resize_", "aten::size", "aten::stride",
    "aten::sym_*", "aten::resolve_conj", "aten::resolve_neg",
)  # fmt: skip


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


#: Kernels Inductor generates (pointwise, reduction, persistent reduction).  On an empty input
#: Inductor launches none for the op's empty tensors, so in a compiled graph they are the graph's
#: work on the op's other, non-empty arguments (Liger's RoPE: its ``cos``/``sin`` glue fused with
#: the context's producer), not the op's kernel replaced: a vanished kernel shows on every
#: non-empty cell of the same op.
INDUCTOR_KERNELS = ("triton_poi_*", "triton_red_*", "triton_per_*")


def launched_nothing(seen: list[str], device_kind: str, mode: str = "eager") -> bool:
    """The trace shows no work: no kernel (CUDA) or no op event beyond allocations and views (CPU)."""
    if device_kind == "cuda":
        if ALL_MODES[mode].inductor:
            seen = [n for n in seen if not any(matches(n, p) for p in INDUCTOR_KERNELS)]
        return not seen
    return all(any(matches(n, p) for p in BOOKKEEPING_EVENTS) for n in seen)


def judge(ctx: CellContext, obs: Observed, ref_copies: list[str], empty_input: bool) -> list[str]:
    """The problems one profiled program shows (empty: it passes); fills ``obs.details``."""
    kind = ctx.device_kind
    rule = ctx.impl.evidence_for(kind, ctx.mode)
    expect_hits = match(obs.seen, rule.expect)
    waived = empty_input and launched_nothing(obs.ran, kind, ctx.mode)
    missing = [] if waived else [p for p, hits in expect_hits.items() if not hits]
    forbidden = {p: hits for p, hits in match(obs.seen, rule.forbid).items() if hits}
    realigned = realignment_copies(obs.copies, misaligned_spans(obs.sample)) if ctx.mode == "compile" else []
    extra = max(0, len(obs.copies) - len(realigned) - len(ref_copies))
    obs.details.update(
        {
            "expect": list(rule.expect),
            "forbid": list(rule.forbid),
            "missing": missing,
            "forbidden": forbidden,
            "expect_waived": "zero-size input and nothing launched" if waived else "",
            "reference_copies": ref_copies,
            "realigned_inputs": realigned,
            "extra_copies": extra,
            "copies_allowed": ctx.copies_allowed,
        }
    )
    obs.hits = sorted({n for h in expect_hits.values() for n in h})
    obs.realigned = realigned
    problems = []
    if obs.note:
        problems.append(obs.note)
    if missing:
        empty = " (the input is empty, but the op ran other work)" if empty_input else ""
        problems.append(f"expected {', '.join(missing)} did not run{empty}")
    if forbidden:
        problems.append(
            "forbidden ran: " + ", ".join(sorted({n for hits in forbidden.values() for n in hits}))
        )
    if extra > ctx.copies_allowed:
        problems.append(
            f"{extra} hidden cop{'y' if extra == 1 else 'ies'} (allowed {ctx.copies_allowed}): "
            + "; ".join(obs.copies)
        )
    return problems


def run(ctx: CellContext) -> CheckResult:
    artifact = ctx.artifact
    assert artifact is not None
    sample = ctx.inputs()[0]
    empty_input = is_empty(sample)
    try:
        observed = observe_mode(ctx, artifact, empty_input)
    except ProfilerBroken as exc:
        return CheckResult(NAME, Verdict.ERROR, str(exc), exc.details)
    ref_sample = ctx.inputs()[0]
    call(ctx.reference, ref_sample)
    ref_trace, _ = profile_call(
        lambda: call(ctx.reference, ref_sample),
        ctx.device_kind,
        ctx.workdir / f"trace-{ctx.mode}-reference.json",
    )
    ref_copies = ref_trace.copies()
    failures: list[str] = []
    for obs in observed:
        problems = judge(ctx, obs, ref_copies, empty_input)
        if problems:
            prefix = f"{obs.label}: " if obs.label else ""
            listing = ", ".join(obs.ran[:12]) + (" ..." if len(obs.ran) > 12 else "")
            failures.append(prefix + "; ".join(problems) + f" (ran: {listing})")
    main = observed[0]
    ctx.kernels = main.ran
    details: dict[str, Any] = {
        "device_kind": ctx.device_kind,
        "mode": ctx.mode,
        "empty_input": empty_input,
        **main.details,
    }
    if len(observed) > 1:
        details["programs"] = {obs.label or "main": obs.details for obs in observed}
    if failures:
        return CheckResult(NAME, Verdict.FALLBACK, " | ".join(failures), details)
    hits = sorted({n for obs in observed for n in obs.hits})
    waived = "; zero-size input, nothing launched (expect waived)" if main.details["expect_waived"] else ""
    note = (
        f"; Inductor realigned {len(main.realigned)} misaligned input(s) before it" if main.realigned else ""
    )
    where = f" in {len(observed)} programs ({', '.join(o.label or 'ep.module()' for o in observed)})"
    where = where if len(observed) > 1 else ""
    return CheckResult(
        NAME, Verdict.PASS, f"ran {', '.join(hits) or 'no forbidden kernel'}{where}{waived}{note}", details
    )


CHECKS = (Check(NAME, applies, run),)
