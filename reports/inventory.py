"""The op inventory: one row per op, built from the specs and the latest benchmark results.

What a release manager or kernel author asks first about an op library: which
ops exist, what they cover (module, shapes, dtypes, implementations), whether
each is memory- or compute-bound, and how close it gets to the roofline.

* **bound** comes from the spec's declared bytes and FLOPs at the op's largest
  shape (bf16): arithmetic intensity against the ridge point of the machine
  whose ceilings are given (default: an H200's measured 4274 GB/s copy and
  788 TFLOP/s bf16 GEMM, ridge about 184 FLOP/byte).
* **achieved** is the best forward % of the copy ceiling (memory-bound ops) that
  an opgate implementation reached at the largest benchmarked shape, read from
  the committed benchmark JSON; "–" when no benchmark exists.
* **fused** is the spec's own ``fused`` declaration (several PyTorch ops in one kernel).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from opgate.ops.cost import CostError, shape_cost
from opgate.ops.spec import OpSpec, load_specs
from opgate.reports import bench_table

COPY_GBPS = 4274.0
GEMM_TFLOPS = 788.0
BF16_ITEMSIZE = 2


def _elements(shape: Sequence[int]) -> int:
    return math.prod(int(d) for d in shape)


def _largest(spec: OpSpec) -> tuple[int, ...]:
    shapes = [tuple(s) for sets in spec.shapes.values() for s in sets]
    return max(shapes, key=_elements)


def intensity(spec: OpSpec) -> float | None:
    """FLOP per byte at the op's largest declared shape in bf16 (None without a cost model)."""
    try:
        nbytes, flops = shape_cost(spec.cost, _largest(spec), BF16_ITEMSIZE)
    except CostError:
        return None
    if not nbytes or flops is None:
        return None
    return flops / nbytes


def achieved(op: str, docs: Iterable[Mapping[str, Any]]) -> str:
    """Best forward % of copy bandwidth of an opgate implementation at the largest benchmarked shape."""
    rows = [
        r
        for d in docs
        if d["op"] == op
        for r in d["rows"]
        if r.get("direction") == "fwd"
        and str(r.get("impl", "")).startswith("opgate")
        and isinstance(r.get("pct_copy"), (int, float))
    ]
    if not rows:
        return "–"
    size = max(bench_table.shape_size(str(r["shape"])) for r in rows)
    best = max(r["pct_copy"] for r in rows if bench_table.shape_size(str(r["shape"])) == size)
    return f"{best:.0f}% of copy"


def rows(specs: Mapping[str, OpSpec], docs: Sequence[Mapping[str, Any]], ridge: float) -> list[list[str]]:
    table = []
    for name in sorted(specs):
        spec = specs[name]
        shapes = [tuple(s) for sets in spec.shapes.values() for s in sets]
        small, large = min(shapes, key=_elements), max(shapes, key=_elements)
        ai = intensity(spec)
        bound = "–" if ai is None else ("compute" if ai >= ridge else "memory") + f" ({ai:.1f} FLOP/B)"
        impls = ", ".join(f"{n} ({i.kind})" for n, i in sorted(spec.implementations.items()))
        table.append(
            [
                name,
                spec.category,
                f"{'x'.join(map(str, small))} .. {'x'.join(map(str, large))}",
                ", ".join(spec.dtypes),
                bound,
                achieved(name, docs),
                impls,
                "yes" if spec.fused else "no",
            ]
        )
    return table


HEADER = ("op", "category", "shapes", "dtypes", "bound (bf16, largest shape)", "achieved", "impls", "fused")


def render(
    specs: Mapping[str, OpSpec], docs: Sequence[Mapping[str, Any]], copy_gbps: float, gemm_tflops: float
) -> str:
    ridge = gemm_tflops * 1e12 / (copy_gbps * 1e9)
    note = (
        f"Ridge point {ridge:.0f} FLOP/byte "
        f"({gemm_tflops:.0f} TFLOP/s bf16 GEMM, {copy_gbps:.0f} GB/s copy). "
        "Achieved: the best forward opgate implementation at the largest benchmarked shape."
    )
    lines = [
        "# opgate op inventory",
        "",
        note,
        "",
        "| " + " | ".join(HEADER) + " |",
        "|" + "---|" * len(HEADER),
    ]
    lines += ["| " + " | ".join(r) + " |" for r in rows(specs, docs, ridge)]
    return "\n".join(lines) + "\n"


def build(
    ops_paths: Sequence[Path], bench_files: Sequence[Path], copy_gbps: float, gemm_tflops: float
) -> str:
    return render(load_specs(ops_paths), bench_table.load(bench_files), copy_gbps, gemm_tflops)
