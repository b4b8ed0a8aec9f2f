"""``opgate perf bench``: opgate's ops against their peers, the published table.

Per first-party op (an op with a ``triton`` or ``cuda`` implementation),
forward and backward, at 8x4096, 4096x4096 and 32768x8192 in bf16 (fp16 and
fp32 too at the largest shape) for row-wise ops, or the spec's ``large`` shape
set otherwise.  All peers of one case — aten, torch.compile of the reference,
Liger-Kernel when importable, every opgate implementation — are timed
interleaved in one session (:mod:`validators.perf.timing`, L2 flushed, inputs
rotated where they fit in L2), so they share the GPU's state.  GB/s is the
spec's declared bytes (``cost.bytes``; ``cost.backward_bytes`` for backward)
over the median, and % of the device-to-device copy ceiling measured in the
same run.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opgate.validators.perf.timing import TimingConfig

if TYPE_CHECKING:
    from opgate.ops.spec import OpSpec

BENCH_SHAPES_2D: tuple[tuple[int, ...], ...] = ((8, 4096), (4096, 4096), (32768, 8192))
EXTRA_DTYPES_AT_LARGEST = ("fp16", "fp32")
DIRECTIONS = ("forward", "backward")
FIRST_PARTY_KINDS = ("triton", "cuda")
BENCH_TIMING = TimingConfig(warmup_ms=25.0, rep_ms=100.0, min_reps=10, max_reps=200)
OPGATE_PREFIX = "opgate-"


@dataclass(frozen=True)
class Case:
    op: str
    shape: tuple[int, ...]
    dtype: str
    direction: str

    @property
    def label(self) -> str:
        return f"{self.op} {'x'.join(map(str, self.shape))} {self.dtype} {self.direction}"


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
    directions: Sequence[str] = DIRECTIONS,
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


def opgate_impls(spec: OpSpec) -> tuple[dict[str, Any], dict[str, str]]:
    """({"opgate-<impl>": entry}, {name: why unavailable}) for the spec's triton/cuda implementations."""
    import importlib

    from opgate.ops.spec import resolve

    found: dict[str, Any] = {}
    missing: dict[str, str] = {}
    for name, impl in spec.implementations.items():
        if impl.kind not in FIRST_PARTY_KINDS:
            continue
        try:
            importlib.import_module(impl.module)
            found[OPGATE_PREFIX + name] = resolve(impl.entry, spec.root)
        except Exception as exc:  # noqa: BLE001 - e.g. a CUDA extension that does not build here
            missing[OPGATE_PREFIX + name] = (
                f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            )
    return found, missing


def _callable(peer: Any, samples: Sequence[Any], direction: str) -> Any:
    """A no-argument callable cycling over ``samples`` (forward call, or autograd.grad of the outputs)."""
    import torch
    from torch.utils import _pytree as pytree

    from opgate.validators.perf.timing import Rotating

    if direction == "forward":
        fn = Rotating(lambda s: peer(*s.args, **s.kwargs), [((s,), {}) for s in samples])
        fn()
        return fn
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    for s in samples:
        args = list(s.args)
        leaves = []
        for i in s.grad_args:
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


def run_case(
    case: Case,
    spec: OpSpec,
    peers: Mapping[str, Any],
    samples: Sequence[Any],
    *,
    copy_gbps: float,
    device: str,
) -> dict[str, Any]:
    """Time every peer of one case interleaved; peers that raise are recorded, not timed."""
    import torch

    from opgate.ops.base import DTYPES
    from opgate.ops.cost import CostError, shape_cost
    from opgate.validators.perf.peers import op_bench_bytes
    from opgate.validators.perf.timing import time_interleaved

    fns, errors = {}, {}
    for name, peer in peers.items():
        fn = _try_callable(peer, samples, case.direction)
        if isinstance(fn, str):
            errors[name] = fn
        else:
            fns[name] = fn
    itemsize = torch.empty((), dtype=DTYPES[case.dtype]).element_size()
    try:
        nbytes, _ = shape_cost(spec.cost, case.shape, itemsize, case.direction)
    except CostError as exc:
        nbytes, errors["cost"] = None, str(exc)
    if nbytes is None:  # the op author's count (ops/<op>/bench.py), e.g. backward bytes
        fwd, bwd = op_bench_bytes(case.op, case.shape, DTYPES[case.dtype], case.dtype)
        nbytes = fwd if case.direction == "forward" else bwd
    results = {}
    try:
        timed = time_interleaved(fns, BENCH_TIMING, device) if fns else {}
    except Exception as exc:  # noqa: BLE001 - one broken case must not lose the rest of the table
        timed, errors["timing"] = {}, f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"
    for name, t in timed.items():
        gbps = None if nbytes is None else nbytes / (t.median_us * 1e-6) / 1e9
        results[name] = {
            "median_us": round(t.median_us, 3), "iqr_us": round(t.iqr_us, 3), "n": len(t.samples_us),
            "gbps": None if gbps is None else round(gbps, 1),
            "pct_copy": None if gbps is None else round(100 * gbps / copy_gbps, 1),
        }  # fmt: skip
    return {**asdict(case), "bytes": nbytes, "results": results, "errors": errors, **verdict(results)}


def verdict(results: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Best peer, and each opgate implementation's speed-up over it (>1: opgate faster)."""
    peers = {n: r["median_us"] for n, r in results.items() if not n.startswith(OPGATE_PREFIX)}
    if not peers:
        return {"best_peer": None, "speedup": {}}
    best = min(peers, key=lambda n: peers[n])
    speedup = {
        n: round(peers[best] / r["median_us"], 3) for n, r in results.items() if n.startswith(OPGATE_PREFIX)
    }
    return {"best_peer": best, "speedup": speedup}


def run_bench(
    cases: Sequence[Case], out: Path, seed: int = 0, device: str = "cuda", peers: Sequence[str] = ()
) -> dict[str, Any]:
    """Run the planned cases; writes ``out/bench.json`` and ``out/bench.md``.

    ``peers``: keep only these peer names (opgate implementations always run).
    """
    import torch

    from opgate.ops.base import DTYPES
    from opgate.ops.spec import load_specs, resolve
    from opgate.validators.perf import ceilings
    from opgate.validators.perf.peers import drop_duplicates, peers_for, unavailable
    from opgate.validators.perf.report import require_cuda, run_info, write_outputs
    from opgate.validators.perf.timing import rotation_count

    if device.startswith("cuda"):
        require_cuda("opgate perf bench")
    t0 = time.perf_counter()
    specs = load_specs()
    info, ceil = run_info(), ceilings.get(0)
    import torch._functorch.config

    # compiled peers' backward is replayed (retain_graph=True): donated buffers would forbid that
    torch._functorch.config.donated_buffer = False
    for key in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, key):  # each case is a new static shape: keep compiling
            setattr(torch._dynamo.config, key, 1024)
    l2 = int(info["l2_bytes"])
    records, missing = [], {}
    peer_cache: dict[str, dict[str, Any]] = {}
    groups: dict[tuple[str, tuple[int, ...], str], list[Case]] = {}
    for case in cases:
        groups.setdefault((case.op, case.shape, case.dtype), []).append(case)
    for (op, shape, dtype), group in groups.items():
        spec = specs[op]
        if op not in peer_cache:
            mine, missing[op] = opgate_impls(spec)
            missing[op].update(unavailable(op))
            others = drop_duplicates(peers_for(op, resolve(spec.reference, spec.root)), mine)
            peer_cache[op] = {**mine, **{n: p for n, p in others.items() if not peers or n in peers}}
        sample_fn = resolve(spec.samples, spec.root)
        first = sample_fn(shape, DTYPES[dtype], device, torch.Generator().manual_seed(seed))
        size = sum(t.untyped_storage().nbytes() for t in first.tensors())
        samples = [first] + [
            sample_fn(shape, DTYPES[dtype], device, torch.Generator().manual_seed(seed + i))
            for i in range(1, rotation_count(size, l2))
        ]
        for case in group:
            records.append(
                run_case(case, spec, peer_cache[op], samples, copy_gbps=ceil.copy_gbps, device=device)
            )
            print(summary_line(records[-1]), flush=True)
        del samples, first
        torch.cuda.empty_cache()
    data = {
        "info": info, "ceilings": ceil.to_json(), "timing": asdict(BENCH_TIMING),
        "cases": records, "unavailable": missing, "wall_s": round(time.perf_counter() - t0, 1),
    }  # fmt: skip
    from opgate.validators.perf.bench_md import markdown

    write_outputs(out, "bench", data, markdown(data))
    return data


def summary_line(record: Mapping[str, Any]) -> str:
    parts = [f"{n} {r['median_us']:.1f}us" for n, r in record["results"].items()]
    shape = "x".join(map(str, record["shape"]))
    return f"{record['op']} {shape} {record['dtype']} {record['direction']}: " + ", ".join(parts)
