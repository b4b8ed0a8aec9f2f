"""What each mode's artifact really ran, profiled: the names evidence patterns are matched against.

One warm call of a program is profiled (:func:`observe`); what counts as the
op's work depends on the mode (:func:`observe_mode`):

* export: ``ep.module()`` and the program ``ep.run_decompositions()`` made of
  it, each profiled on its own;
* cudagraphs (GPU): only the kernels the CUDA graph replay ran.  The cudagraph
  tree's own input copies and opgate's output clones run outside the graph and
  are left out; a replay has no host events, so its copies are the graph
  kernels named like the copy kernels the same op launches when run eagerly
  (:func:`validators.profiling.graph_copies`);
* every other mode: the call.

Work opgate adds around the op is never the op's: the instrumentation kernels
that poison fresh allocations, the producer and consumer of the op's graph
(:mod:`validators.checks.opgraph`, reported apart as ``context``), and the
harness ranges :mod:`validators.profiling` sets aside.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from opgate.validators.checks.artifacts import Artifact, Exported
from opgate.validators.checks.context import call
from opgate.validators.checks.opgraph import (
    CONTEXT_EVENTS,
    GRAPH_MODES,
    context_kernel_matcher,
    is_context_event,
)
from opgate.validators.profiling import Trace, graph_copies, matches, profile_call
from opgate.validators.witness import executed_custom_ops

if TYPE_CHECKING:
    from opgate.ops.base import SampleInput
    from opgate.validators.checks.context import CellContext

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
#: Label of the program ``run_decompositions()`` made of an exported one.
DECOMPOSED = "after run_decompositions()"


class ProfilerBroken(RuntimeError):
    """The profiler saw nothing it should have: the cell's evidence is an ``error``."""

    def __init__(self, message: str, details: dict[str, Any]) -> None:
        super().__init__(message)
        self.details = details


@dataclass
class Observed:
    """One profiled program: ``seen`` is matched against the patterns, ``ran`` is reported."""

    label: str
    sample: SampleInput
    seen: list[str]
    ran: list[str]
    copies: list[str]
    details: dict[str, Any]
    #: a problem of the mode itself (a cudagraphs call that replayed no graph)
    note: str = ""
    hits: list[str] = field(default_factory=list)
    realigned: list[str] = field(default_factory=list)


def _device_names(trace: Trace, replay: bool, in_context: bool) -> tuple[list[str], list[str]]:
    """(kernel names that count, kernel names run outside the CUDA graph when ``replay``).

    Kernels launched by the context's eager ``aten::neg`` (an exported program
    run node by node) are the context's, not the op's.
    """
    context_ids = {
        e.external_id
        for e in trace.host
        if in_context and e.name in CONTEXT_EVENTS and e.external_id is not None
    }
    names, outside = [], []
    for k in trace.kernels:
        if trace.in_graph(k):
            names.append(k.name)
        elif replay:
            outside.append(k.name)
        elif k.external_id not in context_ids:
            names.append(k.name)
    return names, outside


def observe(
    ctx: CellContext,
    fn: Callable[[], Any],
    sample: SampleInput,
    *,
    label: str = "",
    tag: str = "op",
    empty_input: bool = False,
    replay: bool = False,
) -> Observed:
    """Profile one warm call of ``fn`` and sort what ran into the op's work and everything else."""
    kind = ctx.device_kind
    fn()  # warm: compilation, autotuning, lazy init and graph capture stay out of the trace
    trace, _ = profile_call(fn, kind, ctx.workdir / f"trace-{ctx.mode}-{tag}.json")
    where = f"{label}: " if label else ""
    if trace.empty:
        raise ProfilerBroken(f"{where}profiler recorded no events", {"trace": str(trace.path)})
    if kind == "cuda" and not trace.kernels and not empty_input:
        raise ProfilerBroken(
            f"{where}profiler recorded no GPU kernel for a non-empty input (CUPTI unavailable?)",
            {"trace": str(trace.path), "host_events": trace.names("cpu")[:50]},
        )
    outside: list[str] = []
    if kind == "cuda":
        names, outside = _device_names(trace, replay, ctx.mode in GRAPH_MODES)
    else:
        names = [e.name for e in trace.host]
    is_context_kernel = context_kernel_matcher(ctx.impl.qualname)
    in_context = ctx.mode in GRAPH_MODES  # only these cells run the op inside its graph
    context = list(dict.fromkeys(n for n in names if in_context and is_context_event(n, is_context_kernel)))
    seen = list(
        dict.fromkeys(
            n for n in names if n not in context and not any(matches(n, p) for p in INSTRUMENTATION_KERNELS)
        )
    )
    if kind == "cpu" and ctx.impl.qualname:
        # The op's own body ran, in eager and inside the compiled program (see executed_custom_ops):
        # torch 2.14's CPU profiler records no event for a custom op whose arguments are all tensors.
        seen += [n for n in executed_custom_ops(fn, [ctx.impl.qualname]) if n not in seen]
    ran = [n for n in seen if not any(matches(n, p) for p in WRAPPER_EVENTS)]
    note = ""
    if replay and not trace.graph_kernels() and not empty_input:
        listing = ", ".join(dict.fromkeys(n[:80] for n in outside[:8]))
        note = f"no kernel ran from a CUDA graph: the call launched its kernels one by one ({listing})"
    details: dict[str, Any] = {
        "seen": seen,
        "context": context,
        "trace": str(trace.path),
    }
    if replay:
        details["outside_graph"] = list(dict.fromkeys(outside))
        copies = graph_copies(trace, _eager_copy_names(ctx, sample))
    else:
        copies = trace.copies()
    details["copies"] = copies
    return Observed(label, sample, seen, ran, copies, details, note)


def _eager_copy_names(ctx: CellContext, sample: SampleInput) -> frozenset[str]:
    """Names of the copy kernels the op launches when run eagerly on ``sample`` (typed by host events)."""
    fresh = ctx.inputs()[0]
    call(ctx.op, fresh)
    trace, _ = profile_call(
        lambda: call(ctx.op, fresh), ctx.device_kind, ctx.workdir / "trace-eager-copies.json"
    )
    return trace.copy_kernel_names()


def observe_mode(ctx: CellContext, artifact: Artifact, empty_input: bool) -> list[Observed]:
    """The programs the cell's mode runs, each observed (the mode's own program first)."""
    sample = ctx.inputs()[0]
    if isinstance(artifact, Exported) and artifact.in_graph:
        return [
            observe(ctx, lambda: artifact(sample), sample, empty_input=empty_input),
            observe(
                ctx,
                lambda: artifact.run_decomposed(sample),
                sample,
                label=DECOMPOSED,
                tag="decomposed",
                empty_input=empty_input,
            ),
        ]
    replay = ctx.mode == "cudagraphs" and ctx.device_kind == "cuda"
    return [observe(ctx, lambda: artifact(sample), sample, empty_input=empty_input, replay=replay)]
