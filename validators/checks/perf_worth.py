"""The worth-it timing of the perf check: the op against what PyTorch gives in the cell's mode.

What is compared (the rule and its thresholds: :mod:`opgate.validators.perf.worth`):

* eager: the op against the spec's reference run eagerly, the stock aten op
  (``ATEN`` in :mod:`opgate.validators.perf.peers`, the one definition of the
  benchmark peers) and ``torch.compile`` of the reference;
* compile / cudagraphs: the op and the reference each inside the producer /
  consumer graph the correctness checks run the op in
  (:mod:`opgate.validators.checks.opgraph`), compiled the same way
  (``mode="reduce-overhead"`` for cudagraphs).  Where that module is absent the
  op and the reference are compiled alone and the record says so.

Each candidate is timed forward, and forward + ``torch.autograd.grad`` w.r.t.
the sample's ``grad_args`` in one call, interleaved with its baselines by
:func:`opgate.validators.perf.timing.time_interleaved` over rotated copies of
the cell's inputs.  ``timer`` is injectable so the row-building and verdict
logic run on CPU with a host clock in the tests.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from opgate.validators.perf.worth import DIRECTIONS, cell_finding, judge_row

if TYPE_CHECKING:
    from opgate.ops.base import SampleInput
    from opgate.validators.checks.context import CellContext

#: name -> ``fn(sample)`` (its output), the op first.
Candidates = dict[str, Callable[["SampleInput"], Any]]
#: ``timer({name: no-arg callable}) -> {name: samples_us}``
Timer = Callable[[Mapping[str, Callable[[], Any]]], Mapping[str, Sequence[float]]]
ALONE = "op alone"
IN_GRAPH = "producer/consumer graph"


def _opgraph() -> Any:
    try:
        return importlib.import_module("opgate.validators.checks.opgraph")
    except ImportError:
        return None


def _in_graph(fn: Callable[..., Any], compile_kwargs: Mapping[str, Any], og: Any) -> Callable[..., Any]:
    import torch

    if og is None:
        compiled = torch.compile(fn, **compile_kwargs)
        return lambda s: compiled(*s.args, **s.kwargs)
    graph: Callable[..., Any] = torch.compile(og.graph_of(fn), **compile_kwargs)
    step = compile_kwargs.get("mode") == "reduce-overhead"

    def run(s: SampleInput) -> Any:
        if step:  # each call is a new step for CUDA-graph trees (its outputs are not kept)
            torch.compiler.cudagraph_mark_step_begin()
        which = og.plan(s)
        return graph(which, *og.graph_inputs(s, which), **s.kwargs)

    return run


def candidates(ctx: CellContext) -> tuple[Candidates, str]:
    """The op and its baselines for the cell's mode, each taking a SampleInput; and the context's name."""
    import torch

    from opgate.validators.perf.peers import ATEN

    dynamic = True if ctx.spec.dynamic_shapes else None
    ref, op = ctx.reference, ctx.op
    if ctx.mode == "eager":
        fns: Candidates = {
            "op": lambda s: op(*s.args, **s.kwargs),
            "reference": lambda s: ref(*s.args, **s.kwargs),
        }
        aten = ATEN.get(ctx.spec.op)
        if aten is not None:
            fns["aten"] = lambda s: aten(*s.args, **s.kwargs)
        compiled_ref = torch.compile(ref, dynamic=dynamic)
        fns["compile(reference)"] = lambda s: compiled_ref(*s.args, **s.kwargs)
        return fns, ALONE
    kwargs: dict[str, Any] = {"dynamic": dynamic}
    if ctx.mode == "cudagraphs":
        kwargs["mode"] = "reduce-overhead"
    og = _opgraph()
    return {"op": _in_graph(op, kwargs, og), "compile(reference)": _in_graph(ref, kwargs, og)}, (
        IN_GRAPH if og is not None else ALONE
    )


def _with_grad(sample: SampleInput) -> tuple[SampleInput, list[Any]]:
    import dataclasses

    import torch

    args = list(sample.args)
    leaves = []
    for i in sample.differentiable():
        a = args[i]
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            args[i] = a.detach().requires_grad_(True)
            leaves.append(args[i])
    return dataclasses.replace(sample, args=tuple(args)), leaves


def call_for(fn: Callable[[SampleInput], Any], sample: SampleInput, direction: str) -> Callable[[], Any]:
    """A no-argument call of ``fn`` on ``sample``: forward, or forward + autograd.grad of every output."""
    import torch
    from torch.utils import _pytree as pytree

    if direction == "forward":
        return lambda: fn(sample)
    s, leaves = _with_grad(sample)

    def fwd_bwd() -> Any:
        outs = [t for t in pytree.tree_leaves(fn(s)) if isinstance(t, torch.Tensor) and t.requires_grad]
        return torch.autograd.grad(outs, leaves, [torch.ones_like(t) for t in outs], allow_unused=True)

    return fwd_bwd


def directions(sample: SampleInput) -> tuple[str, ...]:
    """forward+backward only where the sample has differentiable arguments."""
    import torch

    grads = any(
        isinstance(sample.args[i], torch.Tensor) and sample.args[i].is_floating_point()
        for i in sample.differentiable()
    )
    return DIRECTIONS if grads else DIRECTIONS[:1]


def _rotating(
    fn: Callable[[SampleInput], Any], samples: Sequence[SampleInput], direction: str
) -> Callable[[], Any]:
    calls = [call_for(fn, s, direction) for s in samples]
    state = {"i": 0}

    def run() -> Any:
        c = calls[state["i"] % len(calls)]
        state["i"] += 1
        return c()

    return run


def worth_rows(
    fns: Candidates,
    samples_by_shape: Mapping[tuple[int, ...], Sequence[SampleInput]],
    timer: Timer,
    *,
    errors: list[str],
) -> list[dict[str, Any]]:
    """One judged row per shape and direction; a candidate that raises is left out with its error."""
    rows: list[dict[str, Any]] = []
    for shape, samples in samples_by_shape.items():
        for direction in directions(samples[0]):
            timed: dict[str, Callable[[], Any]] = {}
            for name, fn in fns.items():
                run = _rotating(fn, samples, direction)
                try:
                    run()
                except Exception as exc:  # noqa: BLE001 - a baseline that cannot run this case is recorded
                    errors.append(f"{name} {list(shape)} {direction}: {type(exc).__name__}: {str(exc)[:200]}")
                    continue
                timed[name] = run
            if "op" not in timed or len(timed) < 2:
                continue
            samples_us = timer(timed)
            baselines = {n: samples_us[n] for n in timed if n != "op"}
            row = judge_row(samples_us["op"], baselines)
            rows.append({"shape": list(shape), "direction": direction, **row})
    return rows


def worth_record(ctx: CellContext, timer: Timer) -> dict[str, Any]:
    """``details["worth_it"]`` of the perf check (rendered by ``reports/worth.py``)."""
    fns, context = candidates(ctx)
    errors: list[str] = []
    samples = {tuple(shape): _samples(ctx, tuple(shape)) for shape in ctx.shapes}
    rows = worth_rows(fns, samples, timer, errors=errors)
    record: dict[str, Any] = {
        "mode": ctx.mode,
        "context": context,
        "baselines": [n for n in fns if n != "op"],
    }
    record["rows"] = rows
    if rows:
        record["summary"] = cell_finding(rows)
    if errors:
        record["errors"] = errors
    return record


def _samples(ctx: CellContext, shape: tuple[int, ...]) -> list[SampleInput]:
    """The cell's inputs for ``shape``, as many copies as fit the L2 rotation rule."""
    import torch

    from opgate.validators.perf.timing import input_bytes, rotation_count

    first = ctx.inputs(shapes=[shape])[0]
    if not ctx.device.startswith("cuda"):
        return [first]
    l2 = int(getattr(torch.cuda.get_device_properties(torch.device(ctx.device)), "L2_cache_size", 0))
    copies = rotation_count(input_bytes([first]), l2)
    return [first] + [ctx.inputs(shapes=[shape])[0] for _ in range(copies - 1)]
