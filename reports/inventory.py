"""The op inventory: one row per op, built from the specs and the latest benchmark results.

What a release manager or kernel author asks first about an op library: which
ops exist, what they cover (module, shapes, dtypes, implementations), whether
each is memory- or compute-bound, and how close it gets to the roofline.

* **bound** comes from the spec's declared bytes and FLOPs at the op's largest
  shape (bf16), through the one cost evaluator (:mod:`opgate.matrix.cost`):
  arithmetic intensity against the ridge point of the ceilings *measured* in
  the given benchmark runs (``bench.json`` ``ceilings``; ``--copy-gbps`` /
  ``--gemm-tflops`` override or fill in what a run did not measure).  Without
  both ceilings the column says so instead of assuming a GPU.
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

from opgate.matrix.cost import CostError, shape_cost
from opgate.matrix.spec import OpSpec, load_specs
from opgate.reports import bench_table

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
    points = [
        (bench_table.shape_size(str(c["label"])), r["pct_copy"])
        for d in docs
        for c in d["cases"]
        if c["op"] == op and c["direction"] == "forward" and not c.get("context")
        for r in c["results"].values()
        if r["role"] == "opgate" and isinstance(r.get("pct_copy"), (int, float))
    ]
    if not points:
        return "–"
    size = max(p[0] for p in points)
    return f"{max(pct for s, pct in points if s == size):.0f}% of copy"


def ceilings(
    docs: Sequence[Mapping[str, Any]], copy_gbps: float | None, gemm_tflops: float | None
) -> tuple[float | None, float | None]:
    """(copy GB/s, GEMM TFLOP/s): the flags where given, else the first run that measured each."""
    for doc in docs:
        measured = doc.get("ceilings") or {}
        copy_gbps = copy_gbps or measured.get("copy_gbps")
        gemm_tflops = gemm_tflops or measured.get("gemm_tflops")
    return copy_gbps, gemm_tflops


def rows(
    specs: Mapping[str, OpSpec], docs: Sequence[Mapping[str, Any]], ridge: float | None
) -> list[list[str]]:
    table = []
    for name in sorted(specs):
        spec = specs[name]
        shapes = [tuple(s) for sets in spec.shapes.values() for s in sets]
        small, large = min(shapes, key=_elements), max(shapes, key=_elements)
        ai = intensity(spec)
        if ai is None:
            bound = "–"
        elif ridge is None:
            bound = f"{ai:.1f} FLOP/B (no ceilings)"
        else:
            bound = ("compute" if ai >= ridge else "memory") + f" ({ai:.1f} FLOP/B)"
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
    specs: Mapping[str, OpSpec],
    docs: Sequence[Mapping[str, Any]],
    copy_gbps: float | None = None,
    gemm_tflops: float | None = None,
) -> str:
    copy_gbps, gemm_tflops = ceilings(docs, copy_gbps, gemm_tflops)
    if copy_gbps and gemm_tflops:
        ridge: float | None = gemm_tflops * 1e12 / (copy_gbps * 1e9)
        note = (
            f"Ridge point {ridge:.0f} FLOP/byte "
            f"({gemm_tflops:.0f} TFLOP/s bf16 GEMM, {copy_gbps:.0f} GB/s copy). "
            "Achieved: the best forward opgate implementation at the largest benchmarked shape."
        )
    else:
        ridge = None
        note = (
            "No measured ceilings (give a bench.json that has them, or --copy-gbps and --gemm-tflops): "
            "bound shows the arithmetic intensity only."
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
    ops_paths: Sequence[Path],
    bench_files: Sequence[Path],
    copy_gbps: float | None = None,
    gemm_tflops: float | None = None,
) -> str:
    return render(load_specs(ops_paths), bench_table.load(bench_files), copy_gbps, gemm_tflops)
