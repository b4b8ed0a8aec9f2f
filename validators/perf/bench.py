"""``opgate perf bench``: the one benchmark harness, opgate's ops against their peers.

Per first-party op (an op with a ``triton`` or ``cuda`` implementation),
forward and backward, at 8x4096, 4096x4096 and 32768x8192 in bf16 (fp16 and
fp32 too at the largest shape) for row-wise ops, or the spec's ``large`` shape
set otherwise.  All peers of one case (:func:`validators.perf.peers.peers_for`:
every opgate implementation, aten, torch.compile of the reference, Liger-Kernel
when importable) are timed interleaved in one session
(:mod:`validators.perf.timing`: CUDA events, L2 flushed, inputs rotated where
they fit in L2), so they share the GPU's state.  GB/s is the spec's declared
bytes (``cost.bytes``; ``cost.backward_bytes`` for backward) over the median —
bytes come from nowhere else — and % is of the device-to-device copy ceiling
measured in the same run.

The record is ``bench.json`` in the one benchmark format (:data:`FORMAT`),
rendered by ``opgate bench`` / ``publish --bench`` (:mod:`reports.bench_table`).
A :class:`Context` runs every peer between the same producer and consumer
(``time_case(..., context=...)``): how an op fares inside the code around it,
e.g. under one ``torch.compile`` with its neighbours.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opgate.validators.perf.peers import FIRST_PARTY_KINDS, Peer
from opgate.validators.perf.report import BENCH_FORMAT
from opgate.validators.perf.timing import TimingConfig

if TYPE_CHECKING:
    from opgate.matrix.spec import OpSpec

FORMAT = BENCH_FORMAT
METHOD = (
    "CUDA-event medians, L2 flushed before every repetition, all peers of a row interleaved; "
    "GB/s = the spec's cost bytes / time"
)

BENCH_SHAPES_2D: tuple[tuple[int, ...], ...] = ((8, 4096), (4096, 4096), (32768, 8192), (65536, 4096))
EXTRA_DTYPES_AT_LARGEST = ("fp16", "fp32")
DIRECTIONS = ("forward", "backward", "forward+backward")
DEFAULT_DIRECTIONS = ("forward", "backward")
BENCH_TIMING = TimingConfig(warmup_ms=25.0, rep_ms=100.0, min_reps=10, max_reps=200)


@dataclass(frozen=True)
class Case:
    op: str
    shape: tuple[int, ...]
    dtype: str
    direction: str

    @property
    def label(self) -> str:
        return f"{self.op} {shape_label(self.shape)} {self.dtype} {self.direction}"


def shape_label(shape: Sequence[int]) -> str:
    """``(32768, 8192)`` -> ``"32768x8192"``: how a shape is shown in records and tables."""
    return "x".join(map(str, shape))


@dataclass(frozen=True)
class Context:
    """The code around the op: ``producer`` makes the op's arguments, ``consumer`` takes its output.

    Every peer of a case runs as ``consumer(peer(*producer(*sample args)))``
    (``producer`` returns ``(args, kwargs)``), compiled as one graph when
    ``compile`` is set, so peers are compared where the op is used rather than
    alone.  Times then include the neighbours: a contextual record carries the
    context's name and no GB/s.
    """

    name: str
    producer: Callable[..., tuple[tuple[Any, ...], dict[str, Any]]] | None = None
    consumer: Callable[[Any], Any] | None = None
    compile: bool = False

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        producer, consumer = self.producer, self.consumer

        def in_context(*args: Any, **kwargs: Any) -> Any:
            if producer is not None:
                args, kwargs = producer(*args, **kwargs)
            out = fn(*args, **kwargs)
            return consumer(out) if consumer is not None else out

        if not self.compile:
            return in_context
        import torch

        return torch.compile(in_context, dynamic=False)


@dataclass(frozen=True)
class GraphContext(Context):
    """The producer/consumer graph the correctness checks run compile cells in, compiled as one graph.

    The graph itself is :mod:`opgate.validators.checks.opgraph`'s (defined once,
    there); this only adapts it to a peer's signature, so a benchmark row "in
    context" and a perf cell's worth-it row time the same code around the op.
    """

    name: str = "producer/consumer graph"
    compile: bool = True

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        import importlib

        import torch

        from opgate.ops.base import SampleInput

        og = importlib.import_module("opgate.validators.checks.opgraph")
        graph: Callable[..., Any] = torch.compile(og.graph_of(fn), dynamic=False)

        def in_graph(*args: Any, **kwargs: Any) -> Any:
            sample = SampleInput(args=tuple(args), kwargs=dict(kwargs))
            which = og.plan(sample)
            return graph(which, *og.graph_inputs(sample, which), **kwargs)

        return in_graph


def first_party(specs: Mapping[str, OpSpec]) -> list[str]:
    return sorted(
        op for op, s in specs.items() if any(i.kind in FIRST_PARTY_KINDS for i in s.implementations.values())
    )


def default_shapes(spec: OpSpec) -> list[tuple[int, ...]]:
    """The standard row-wise shapes for 2-D ops; the spec's ``large`` (else ``default``) set otherwise."""
    if all(len(s) == 2 for s in spec.shapes["default"]):
        return list(BENCH_SHAPES_2D)
    return list(spec.shapes.get("large") or spec.shapes["default"])


def plan(
    specs: Mapping[str, OpSpec],
    ops: Sequence[str] = (),
    shapes: Sequence[tuple[int, ...]] = (),
    dtypes: Sequence[str] = (),
    directions: Sequence[str] = DEFAULT_DIRECTIONS,
) -> list[Case]:
    """Every case to time, in order; unknown or third-party ops are a ValueError naming the choices."""
    known = first_party(specs)
    chosen = list(ops) or known
    bad = [op for op in chosen if op not in known]
    if bad:
        raise ValueError(f"not a first-party op: {', '.join(bad)} (first-party ops: {', '.join(known)})")
    wrong = [d for d in directions if d not in DIRECTIONS]
    if wrong:
        raise ValueError(f"unknown direction {', '.join(wrong)} (choose from {', '.join(DIRECTIONS)})")
    cases = []
    for op in chosen:
        spec = specs[op]
        op_shapes = [tuple(s) for s in shapes] or default_shapes(spec)
        largest = max(op_shapes, key=math.prod)
        for shape in op_shapes:
            wanted = list(dtypes) or ["bf16", *(EXTRA_DTYPES_AT_LARGEST if shape == largest else ())]
            for dtype in (d for d in wanted if d in spec.dtypes):
                cases += [Case(op, shape, dtype, direction) for direction in directions]
    return cases


def _callable(peer: Any, samples: Sequence[Any], direction: str) -> Any:
    """A no-argument callable cycling over ``samples`` (forward call, or autograd.grad of the outputs)."""
    import torch
    from torch.utils import _pytree as pytree

    from opgate.validators.perf.timing import Rotating

    if direction == "forward":
        fn = Rotating(lambda s: peer(*s.args, **s.kwargs), [((s,), {}) for s in samples])
        fn()
        return fn
    if direction == "forward+backward":  # one training step: forward, then autograd.grad
        from opgate.validators.checks.perf_worth import call_for

        steps = [call_for(lambda smp: peer(*smp.args, **smp.kwargs), s, direction) for s in samples]
        step = Rotating(lambda c: c(), [((c,), {}) for c in steps])
        step()
        return step
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    for s in samples:
        args = list(s.args)
        leaves = []
        for i in s.differentiable():
            if isinstance(args[i], torch.Tensor) and args[i].is_floating_point():
                args[i] = args[i].detach().requires_grad_(True)
                leaves.append(args[i])
        outs = [
            t
            for t in pytree.tree_leaves(peer(*args, **s.kwargs))
            if isinstance(t, torch.Tensor) and t.requires_grad
        ]
        grads = [torch.randn_like(t) for t in outs]
        calls.append(((outs, leaves, grads), {}))
    fn = Rotating(lambda o, i, g: torch.autograd.grad(o, i, g, retain_graph=True), calls)
    fn()
    return fn


def _try_callable(peer: Any, samples: Sequence[Any], direction: str) -> Any:
    """:func:`_callable`, or the one-line error when the peer cannot run this case."""
    try:
        return _callable(peer, samples, direction)
    except Exception as exc:  # noqa: BLE001 - a peer that cannot run this case is reported as such
        return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"


def time_case(
    case: Case,
    spec: OpSpec,
    peers: Sequence[Peer],
    samples: Sequence[Any],
    *,
    copy_gbps: float,
    device: str,
    context: Context | None = None,
) -> dict[str, Any]:
    """Time every peer of one case interleaved; peers that raise are recorded, not timed.

    The record (one ``cases`` entry of :data:`FORMAT`): the case, the bytes the
    spec declares for it, and per peer its role and timing (median, IQR,
    repetitions, GB/s and % of the copy ceiling), or the one-line error.
    """
    import torch

    from opgate.matrix.cost import CostError, shape_cost
    from opgate.ops.base import DTYPES
    from opgate.validators.perf.timing import time_interleaved

    fns, errors = {}, {}
    for peer in peers:
        fn = _try_callable(context.wrap(peer.fn) if context else peer.fn, samples, case.direction)
        if isinstance(fn, str):
            errors[peer.name] = fn
        else:
            fns[peer.name] = fn
    itemsize = torch.empty((), dtype=DTYPES[case.dtype]).element_size()
    nbytes: float | None
    try:
        nbytes, _ = shape_cost(spec.cost, case.shape, itemsize, case.direction)
    except CostError as exc:
        nbytes, errors["cost"] = None, str(exc)
    try:
        timed = time_interleaved(fns, BENCH_TIMING, device) if fns else {}
    except Exception as exc:  # noqa: BLE001 - one broken case must not lose the rest of the table
        timed, errors["timing"] = {}, f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"
    roles = {p.name: p.role for p in peers}
    results = {}
    for name, t in timed.items():
        gbps = None if nbytes is None or context else nbytes / (t.median_us * 1e-6) / 1e9
        results[name] = {
            "role": roles[name], "median_us": round(t.median_us, 3), "iqr_us": round(t.iqr_us, 3),
            "n": len(t.samples_us), "gbps": None if gbps is None else round(gbps, 1),
            "pct_copy": None if gbps is None else round(100 * gbps / copy_gbps, 1),
        }  # fmt: skip
    return {
        **asdict(case), "label": shape_label(case.shape), "context": context.name if context else None,
        "bytes": None if nbytes is None else int(nbytes), "results": results, "errors": errors,
    }  # fmt: skip


def _compile_settings() -> None:
    import torch._dynamo.config
    import torch._functorch.config

    # compiled peers' backward is replayed (retain_graph=True): donated buffers would forbid that
    torch._functorch.config.donated_buffer = False
    for key in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, key):  # each case is a new static shape: keep compiling
            setattr(torch._dynamo.config, key, 1024)


def samples_for(
    spec: OpSpec, shape: tuple[int, ...], dtype: str, device: str, *, seed: int, l2: int
) -> list[Any]:
    """The spec's sample inputs for one shape, as many copies as :func:`rotation_count` asks for."""
    import torch

    from opgate.matrix.spec import resolve
    from opgate.ops.base import DTYPES
    from opgate.validators.perf.timing import input_bytes, rotation_count

    sample_fn = resolve(spec.samples, spec.root)
    first = sample_fn(shape, DTYPES[dtype], device, torch.Generator().manual_seed(seed))
    size = input_bytes([first])
    return [first] + [
        sample_fn(shape, DTYPES[dtype], device, torch.Generator().manual_seed(seed + i))
        for i in range(1, rotation_count(size, l2))
    ]


def run_bench(
    cases: Sequence[Case],
    out: Path,
    seed: int = 0,
    device: str = "cuda",
    *,
    peers: Sequence[str] = (),
    context: Context | None = None,
) -> dict[str, Any]:
    """Run the planned cases; writes ``out/bench.json`` (:data:`FORMAT`) and returns it.

    ``peers``: keep only these peer names (opgate's implementations always run).
    ``context``: run every case inside it (see :class:`Context`).
    """
    import torch

    from opgate.matrix.spec import load_specs
    from opgate.validators.perf import ceilings
    from opgate.validators.perf.peers import ROLE_PEER, peers_for
    from opgate.validators.perf.report import require_cuda, run_info

    if device.startswith("cuda"):
        require_cuda("opgate perf bench")
    t0 = time.perf_counter()
    specs = load_specs()
    info, ceil = run_info(), ceilings.get(0)
    _compile_settings()
    records: list[dict[str, Any]] = []
    missing: dict[str, dict[str, str]] = {}
    chosen: dict[str, list[Peer]] = {}
    groups: dict[tuple[str, tuple[int, ...], str], list[Case]] = {}
    for case in cases:
        groups.setdefault((case.op, case.shape, case.dtype), []).append(case)
    for (op, shape, dtype), group in groups.items():
        spec = specs[op]
        if op not in chosen:
            every, missing[op] = peers_for(spec)
            chosen[op] = [p for p in every if p.role != ROLE_PEER or not peers or p.name in peers]
        samples = samples_for(spec, shape, dtype, device, seed=seed, l2=int(info["l2_bytes"]))
        for case in group:
            record = time_case(
                case, spec, chosen[op], samples, copy_gbps=ceil.copy_gbps, device=device, context=context
            )
            records.append(record)
            print(summary_line(record), flush=True)
        del samples
        torch.cuda.empty_cache()
        # written after every group: a run stopped by its time limit keeps the cases it finished
        data = _document(info, ceil, records, missing, t0, complete=False)
        _write(out, data)
    data = _document(info, ceil, records, missing, t0, complete=True)
    _write(out, data)
    return data


def _document(
    info: Mapping[str, Any],
    ceil: Any,
    records: list[dict[str, Any]],
    missing: Any,
    t0: float,
    *,
    complete: bool,
) -> dict[str, Any]:
    return {
        "format": FORMAT, "info": info, "ceilings": ceil.to_json(),
        "timing": {**asdict(BENCH_TIMING), "method": METHOD}, "cases": records,
        "unavailable": missing, "wall_s": round(time.perf_counter() - t0, 1),
        "replay": replay_status(), "complete": complete,
    }  # fmt: skip


def _write(out: Path, data: Mapping[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "bench.json.tmp"
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(out / "bench.json")


def replay_status() -> dict[str, Any]:
    """Whether opgate's Triton ops ran on the launch-replay path in this run (and how often)."""
    from opgate.ops import _replay

    return _replay.status()


def summary_line(record: Mapping[str, Any]) -> str:
    parts = [f"{n} {r['median_us']:.1f}us" for n, r in record["results"].items()]
    return f"{record['op']} {record['label']} {record['dtype']} {record['direction']}: " + ", ".join(parts)
