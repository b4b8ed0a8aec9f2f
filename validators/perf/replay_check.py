"""``opgate perf replay``: the launch-replay path on a GPU — correct first, then cheap.

1. **Correct.**  For every first-party Triton op, over its sample shapes,
   layouts and dtypes: the replayed outputs and gradients equal, bit for bit,
   those of the same op with replay bypassed (every launch made by the Python
   launcher through Triton's JIT), and stay close to the spec's reference.  A
   case that differs fails the command (exit 1) before anything is timed.
2. **Cheap.**  Host microseconds per call, forward and forward+backward, at
   8x4096 bf16 (GPU work is a few microseconds there, so the host is what is
   measured): opgate's Triton op replayed, the same op with replay bypassed,
   aten, opgate's CUDA C++ op and Liger where present.  The target (issue 17)
   is the replayed op at no more than aten + 5 us.

Writes ``replay.json``; prints one line per case.  The full validation of the
replayed ops (tolerances, evidence, compile, cudagraphs, export) is the
matrix's: run the GPU matrix after this.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

#: The row-wise ops' layouts checked here (zero-size never replays: it launches nothing).
LAYOUTS = ("contiguous", "transposed", "broadcast", "misaligned")
DTYPES = ("bf16", "fp32")
HOST_TARGET_US = 5.0


def host_us(run: Callable[[], Any], calls: int = 300) -> float:
    """Host time per call: the loop never waits for the GPU (one sync before, one after)."""
    import torch

    for _ in range(20):
        run()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        run()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def _forward_backward(fn: Callable[..., Any], sample: Any) -> Callable[[], Any]:
    """forward + autograd.grad w.r.t. the sample's grad_args, with fixed cotangents."""
    import torch
    from torch.utils import _pytree as pytree

    from opgate.validators.checks.perf_worth import _with_grad

    s, leaves = _with_grad(sample)
    cots: list[Any] = []

    def run() -> Any:
        outs = [t for t in pytree.tree_leaves(fn(*s.args, **s.kwargs)) if isinstance(t, torch.Tensor)]
        if not cots:
            gen = torch.Generator(device=outs[0].device).manual_seed(7)
            cots.extend(torch.randn(o.shape, dtype=o.dtype, device=o.device, generator=gen) for o in outs)
        grads = torch.autograd.grad(outs, leaves, cots, allow_unused=True) if leaves else ()
        return [o.detach() for o in outs], list(grads)

    return run


def _same(a: Sequence[Any], b: Sequence[Any]) -> bool:
    import torch

    return len(a) == len(b) and all(
        (x is None and y is None)
        or (x is not None and y is not None and torch.equal(x.nan_to_num(), y.nan_to_num()))
        for x, y in zip(a, b, strict=True)
    )


def check_op(
    spec: Any,
    fn: Callable[..., Any],
    impl: str = "triton",
    *,
    device: str = "cuda",
    shapes: Sequence[tuple[int, ...]] = (),
) -> list[dict[str, Any]]:
    """Replayed vs bypassed (bit for bit) and vs the reference, per shape x layout x dtype.

    For a non-Triton implementation (the CUDA C++ ops) only the reference comparison applies.
    """
    import torch

    from opgate.matrix.spec import resolve
    from opgate.ops import _replay as replay
    from opgate.ops.base import DTYPES as TORCH_DTYPES
    from opgate.validators.layouts import LayoutError, apply_layout

    sample_fn, reference = resolve(spec.samples, spec.root), resolve(spec.reference, spec.root)
    if not shapes:
        shapes = [tuple(s) for s in spec.shapes["default"]]
        shapes += [tuple(s) for s in spec.shapes.get("large", [])[:1]]
    rows = []
    for shape in shapes:
        for dname in DTYPES:
            for layout in LAYOUTS:
                gen = torch.Generator().manual_seed(0)
                try:
                    sample = apply_layout(sample_fn(shape, TORCH_DTYPES[dname], device, gen), layout)
                except LayoutError:
                    continue  # the op's samples have no such layout
                row: dict[str, Any] = {"op": spec.op, "impl": impl, "shape": list(shape), "dtype": dname}
                row["layout"] = layout
                try:
                    with replay.bypassed():
                        py_out, py_grads = _forward_backward(fn, sample)()
                    run = _forward_backward(fn, sample)
                    run()  # records (or reuses) the plan
                    out, grads = run()  # replayed
                    ref = list(torch.utils._pytree.tree_leaves(reference(*sample.args, **sample.kwargs)))
                    close = all(
                        torch.allclose(o.float(), r.float(), rtol=5e-2, atol=5e-2)
                        for o, r in zip(out, ref, strict=True)
                    )
                    row["near_reference"] = close
                    if impl == "triton":
                        row.update(same_forward=_same(out, py_out), same_backward=_same(grads, py_grads))
                    row["ok"] = close and row.get("same_forward", True) and row.get("same_backward", True)
                except Exception as exc:  # noqa: BLE001 - a crash is this case's result
                    row.update(
                        ok=False, error=f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:300]}"
                    )
                rows.append(row)
    return rows


def host_table(spec: Any, shape: tuple[int, ...] = (8, 4096)) -> list[dict[str, Any]]:
    """Host us per call for opgate (replayed / bypassed), aten, CUDA C++ and Liger, forward and fwd+bwd."""
    import torch

    from opgate.matrix.spec import resolve
    from opgate.ops import _replay as replay
    from opgate.validators.perf.peers import ROLE_VARIANT, peers_for

    sample_fn = resolve(spec.samples, spec.root)
    if len(shape) != len(spec.shapes["default"][0]):
        shape = tuple(spec.shapes["default"][-1])
    sample = sample_fn(shape, torch.bfloat16, "cuda", torch.Generator().manual_seed(0))
    peers, _missing = peers_for(spec)
    rows = []
    for peer in peers:
        if peer.role == ROLE_VARIANT or peer.name.startswith("compile"):
            continue  # compiled callables: their host cost is Dynamo's guards, timed by the bench
        variants = [(peer.name, False)] + (
            [(f"{peer.name} (replay bypassed)", True)] if peer.name == "opgate-triton" else []
        )
        for name, bypass in variants:
            for direction in ("forward", "forward+backward"):
                run: Callable[[], Any]
                if direction == "forward":
                    run = functools.partial(peer.fn, *sample.args, **sample.kwargs)
                else:
                    run = _forward_backward(peer.fn, sample)
                try:
                    if bypass:
                        with replay.bypassed():
                            us = host_us(run)
                    else:
                        us = host_us(run)
                    rows.append(
                        {
                            "op": spec.op,
                            "peer": name,
                            "direction": direction,
                            "shape": list(shape),
                            "host_us": round(us, 2),
                        }
                    )
                except Exception as exc:  # noqa: BLE001
                    rows.append(
                        {"op": spec.op, "peer": name, "direction": direction, "error": str(exc)[:200]}
                    )
    return rows


def targets(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per op and direction: replayed host us against aten's + 5 us."""
    out = []
    by = {(r["op"], r["peer"], r["direction"]): r.get("host_us") for r in rows}
    for op, direction in sorted({(r["op"], r["direction"]) for r in rows}):
        mine, aten = by.get((op, "opgate-triton", direction)), by.get((op, "aten", direction))
        if mine is None or aten is None:
            continue
        out.append(
            {"op": op, "direction": direction, "opgate_us": mine, "aten_us": aten,
             "met": mine <= aten + HOST_TARGET_US}
        )  # fmt: skip
    return out


def run_replay_check(out: Path, ops: Sequence[str] = ()) -> dict[str, Any]:
    from opgate.matrix.spec import load_specs, resolve
    from opgate.ops import _replay as replay
    from opgate.validators.perf.report import require_cuda, run_info

    require_cuda("opgate perf replay")
    t0 = time.perf_counter()
    specs = load_specs()
    chosen = [o for o in ops or sorted(specs) if "triton" in specs[o].implementations]
    entries: dict[tuple[str, str], Any] = {}
    missing: dict[str, str] = {}
    for op in chosen:
        for name, impl in specs[op].implementations.items():
            if impl.kind not in ("triton", "cuda"):
                continue
            try:
                __import__(impl.module)
                entries[(op, name)] = resolve(impl.entry, specs[op].root)
            except Exception as exc:  # noqa: BLE001 - e.g. a CUDA C++ op that did not build
                missing[f"{op}.{name}"] = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
    data: dict[str, Any] = {"info": run_info(), "replay": replay.status()}
    if not data["replay"]["enabled"]:
        data["failed"] = f"replay is not enabled here: {data['replay']['why_not']}"
    cases = []
    data["unavailable"] = missing
    for (op, impl_name), fn in entries.items():
        rows = check_op(specs[op], fn, impl_name)
        bad = [r for r in rows if not r["ok"]]
        what = (
            "identical to the Python path and near the reference"
            if impl_name == "triton"
            else "near the reference"
        )
        print(f"{op}.{impl_name}: {len(rows) - len(bad)}/{len(rows)} cases {what}", flush=True)
        for r in bad[:5]:
            print(f"  differs: {r}", flush=True)
        cases += rows
        _write(out, {**data, "cases": cases, "complete": False})
    data["cases"] = cases
    data["replay_after"] = replay.status()
    if any(not r["ok"] for r in cases):
        data["failed"] = (
            f"{sum(not r['ok'] for r in cases)} case(s) differ (from the Python path or the reference)"
        )
    host = []
    if "failed" not in data:
        for op in chosen:
            host += host_table(specs[op])
        for r in host:
            print(
                f"host {r['op']} {r['peer']} {r['direction']}: {r.get('host_us', r.get('error'))}", flush=True
            )
    data["host"] = host
    data["targets"] = targets(host)
    data["wall_s"] = round(time.perf_counter() - t0, 1)
    _write(out, {**data, "complete": True})
    return data


def _write(out: Path, data: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "replay.json.tmp").write_text(json.dumps(data, indent=1) + "\n")
    (out / "replay.json.tmp").replace(out / "replay.json")
