"""Shared benchmark driver for ``ops/<op>/bench.py`` (GPU only; not a test).

Why one driver: every op is judged the same way (issue 4): ``triton.testing.do_bench``
medians with the L2 flushed between repetitions, the peers timed in the same run,
GB/s from the bytes each direction must move at least, and the percentage of
the device-to-device copy bandwidth (4274 GB/s measured on the H200).

Each op's bench.py describes its problems (inputs, which are differentiable,
bytes per direction) and its implementations; this module times forward and
backward of each, prints a table and writes JSON.

Reading small shapes: do_bench hides host time only behind its L2-flush kernel,
so a Python custom op (custom_op dispatch + Triton launch: 50-130 us of host per
forward call and 300-400 us per backward on the H200 machine's CPU) is timed on
its host overhead there, as is torch.compile's wrapper; ``--host`` prints that
overhead per implementation and direction.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import importlib
import itertools
import json
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

COPY_GBPS_H200 = 4274.0


@dataclass
class Problem:
    """One benchmarked input set: ``args`` to every implementation, bytes moved per direction."""

    label: str
    dtype: str
    args: tuple[Any, ...]
    grad_args: tuple[int, ...]
    fwd_bytes: int
    bwd_bytes: int
    kwargs: dict[str, Any] = field(default_factory=dict)


Impl = tuple[str, Callable[..., Any]]


def _outputs(out: Any) -> list[torch.Tensor]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _time_ms(fn: Callable[[], Any]) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, return_mode="median"))


def measure_copy_gbps(device: torch.device, gib: float = 2.0) -> float:
    """Device-to-device copy bandwidth, bytes read + written (the roofline the targets use)."""
    n = int(gib * 2**30) // 2
    src = torch.randn(n, device=device, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    ms = _time_ms(functools.partial(dst.copy_, src))
    return 2 * n * 2 / (ms * 1e-3) / 1e9


def _fwd_timer(fn: Callable[..., Any], problem: Problem) -> tuple[Callable[[], Any], int]:
    def run() -> Any:
        return fn(*problem.args, **problem.kwargs)

    return run, problem.fwd_bytes


def _bwd_timer(fn: Callable[..., Any], problem: Problem) -> tuple[Callable[[], Any], int]:
    """Backward only: the forward runs once, autograd.grad replays the backward graph.

    autograd.grad rather than .backward: nothing accumulates into .grad (and no
    clone of a gradient shared by two leaves), so only the op's backward is timed.
    """
    args = list(problem.args)
    leaves = []
    for i in problem.grad_args:
        args[i] = args[i].detach().requires_grad_(True)
        leaves.append(args[i])
    outs = _outputs(fn(*args, **problem.kwargs))
    cots = [torch.randn_like(o) for o in outs]

    def run() -> Any:
        return torch.autograd.grad(outs, leaves, cots, retain_graph=True)

    return run, problem.bwd_bytes


def bench_problem(
    op: str, problem: Problem, impls: Sequence[Impl], directions: Sequence[str]
) -> list[dict[str, Any]]:
    """Time each implementation's forward and/or backward on ``problem``; failures are recorded, not fatal."""
    rows: list[dict[str, Any]] = []
    for name, fn in impls:
        for direction in directions:
            row: dict[str, Any] = {"op": op, "shape": problem.label, "dtype": problem.dtype, "impl": name}
            row["direction"] = direction
            try:
                run, nbytes = (_fwd_timer if direction == "fwd" else _bwd_timer)(fn, problem)
                ms = _time_ms(run)
                row.update(us=ms * 1e3, gbps=nbytes / (ms * 1e-3) / 1e9)
            except Exception as exc:  # noqa: BLE001 - a peer that cannot run is a table entry, not a crash
                first = str(exc).splitlines()[0][:160] if str(exc) else ""
                row.update(error=f"{type(exc).__name__}: {first}")
            rows.append(row)
    return rows


def host_us(run: Callable[[], Any], calls: int = 200) -> float:
    """Host time per call (launch overhead), what small shapes are really timed on.

    do_bench hides host time behind its L2-flush kernel only up to that kernel's
    duration; past it, the median measures the host, not the GPU.
    """
    for _ in range(10):
        run()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        run()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def host_rows(
    op: str, problem: Problem, impls: Sequence[Impl], directions: Sequence[str]
) -> list[dict[str, Any]]:
    """One row per implementation and direction with the host microseconds per call."""
    rows: list[dict[str, Any]] = []
    for name, fn in impls:
        for direction in directions:
            row: dict[str, Any] = {"op": op, "shape": problem.label, "dtype": problem.dtype, "impl": name}
            row["direction"] = f"host-{direction}"
            try:
                run, _ = (_fwd_timer if direction == "fwd" else _bwd_timer)(fn, problem)
                row["host_us"] = host_us(run)
                row["error"] = f"host {row['host_us']:.1f} us/call"
            except Exception as exc:  # noqa: BLE001 - reported like bench_problem does
                row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
            rows.append(row)
    return rows


def sweep(op: str, problem: Problem, impl: Impl) -> list[dict[str, Any]]:
    """Time the backward of ``impl`` under each BWD_TUNING setting (restored afterwards)."""
    from opgate.ops._triton_util import BWD_TUNING

    saved = dict(BWD_TUNING)
    rows: list[dict[str, Any]] = []
    try:
        for per_sm, prefetch, warps in itertools.product((1, 2, 4), (False, True), (None, 8, 32)):
            BWD_TUNING.update(programs_per_sm=per_sm, prefetch=prefetch, warps=warps)
            label = f"{impl[0]} [sm x{per_sm} pf={int(prefetch)} w={warps or 'auto'}]"
            rows += bench_problem(op, problem, [(label, impl[1])], ["bwd"])
    finally:
        BWD_TUNING.update(saved)
    return rows


def print_table(rows: Sequence[dict[str, Any]], copy_gbps: float) -> None:
    print(f"{'op':<20} {'dir':<4} {'shape':<22} {'dtype':<5} {'impl':<26} {'us':>9} {'GB/s':>8} {'%copy':>6}")
    for r in rows:
        if "error" in r:
            head = f"{r['op']:<20} {r['direction']:<4} {r['shape']:<22} {r['dtype']:<5} {r['impl']:<26}"
            print(f"{head} {r['error']}")
            continue
        pct = 100.0 * r["gbps"] / copy_gbps
        print(
            f"{r['op']:<20} {r['direction']:<4} {r['shape']:<22} {r['dtype']:<5} {r['impl']:<26} "
            f"{r['us']:>9.1f} {r['gbps']:>8.0f} {pct:>5.1f}%"
        )


def parse_shapes(text: str) -> list[tuple[int, ...]]:
    """``"8x4096,4096x4096"`` -> [(8, 4096), (4096, 4096)]."""
    return [tuple(int(v) for v in item.split("x")) for item in text.split(",") if item]


def main(
    op: str,
    default_shapes: str,
    problems: Callable[[tuple[int, ...], torch.dtype, str, torch.device], Problem],
    impls: Callable[[], list[Impl]],
    argv: Sequence[str] | None = None,
) -> int:
    """Command line shared by every ops/<op>/bench.py; returns the exit status."""
    parser = argparse.ArgumentParser(description=f"Benchmark {op} against its peers (CUDA only).")
    parser.add_argument("--shapes", default=default_shapes, help="comma-separated, e.g. 8x4096,4096x4096")
    parser.add_argument("--dtypes", default="bf16", help="comma-separated of fp32,fp16,bf16")
    parser.add_argument("--directions", default="fwd,bwd")
    parser.add_argument(
        "--copy-gbps", type=float, default=COPY_GBPS_H200, help="roofline (bytes read + written)"
    )
    parser.add_argument("--measure-copy", action="store_true", help="measure the copy bandwidth first")
    parser.add_argument("--out", type=Path, help="write the rows as JSON here")
    parser.add_argument("--host", action="store_true", help="also report host microseconds per forward call")
    parser.add_argument(
        "--sweep", action="store_true", help="sweep the backward launch knobs (opgate impl only)"
    )
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(f"{op} bench: needs a CUDA device (none here); nothing was measured.", file=sys.stderr)
        return 2
    import triton

    device = torch.device("cuda")
    # compiled peers' backward is replayed (retain_graph): donated buffers would forbid that
    setattr(importlib.import_module("torch._functorch.config"), "donated_buffer", False)  # noqa: B010
    copy_gbps = measure_copy_gbps(device) if args.measure_copy else args.copy_gbps
    dtypes = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
    rows: list[dict[str, Any]] = []
    impl_list = impls()
    for shape in parse_shapes(args.shapes):
        for dname in args.dtypes.split(","):
            torch.manual_seed(0)
            problem = problems(shape, dtypes[dname], dname, device)
            if args.sweep:
                rows += sweep(op, problem, impl_list[0])
                continue
            rows += bench_problem(op, problem, impl_list, args.directions.split(","))
            if args.host:
                rows += host_rows(op, problem, impl_list, args.directions.split(","))
            torch.cuda.empty_cache()
    for r in rows:
        if "gbps" in r:
            r["pct_copy"] = 100.0 * r["gbps"] / copy_gbps
    print_table(rows, copy_gbps)
    if args.out:
        meta = {
            "device": torch.cuda.get_device_name(device),
            "capability": "sm_{}{}".format(*torch.cuda.get_device_capability(device)),
            "torch": torch.__version__,
            "triton": triton.__version__,
            "python": platform.python_version(),
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "copy_gbps": copy_gbps,
            "method": "triton.testing.do_bench median, L2 flushed; GB/s = minimal bytes / time",
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"meta": meta, "op": op, "rows": rows}, indent=1) + "\n")
    return 0


def spec_impl(op: str, impl: str) -> Callable[..., Any] | None:
    """opgate's ``impl`` implementation of ``op`` as its spec names it, or None with the reason printed.

    The same loading as ``opgate perf bench`` (a CUDA C++ op is built
    on first import, cached); a machine without nvcc still benchmarks the rest.
    """
    from opgate.ops.spec import load_specs
    from opgate.validators.perf.bench import OPGATE_PREFIX, opgate_impls

    found, missing = opgate_impls(load_specs()[op])
    name = OPGATE_PREFIX + impl
    if name in missing:
        print(f"{op} {impl}: left out of the benchmark: {missing[name]}", file=sys.stderr)
    fn: Callable[..., Any] | None = found.get(name)
    return fn


def liger(module: str, attr: str) -> Callable[..., Any] | None:
    """A Liger-Kernel callable when the package is importable, else None (peer left out)."""
    try:
        mod = __import__(module, fromlist=[attr])
    except ImportError:
        return None
    return getattr(mod, attr, None)
