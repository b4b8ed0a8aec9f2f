"""The bench table as Markdown: one table per op, one column per peer, the verdict last."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opgate.validators.perf.report import header, table

OPGATE_PREFIX = "opgate-"


def _cell(result: Mapping[str, Any] | None, error: str | None) -> str:
    if result is None:
        return f"error: {error}" if error else "—"
    text = f"{result['median_us']:.1f} us"
    if result.get("gbps") is not None:
        text += f", {result['gbps']:.0f} GB/s ({result['pct_copy']:.0f}%)"
    return text


def _verdict(case: Mapping[str, Any]) -> str:
    if not case["speedup"]:
        return "—"
    parts = []
    for name, x in case["speedup"].items():
        mark = "faster" if x >= 1.0 else "SLOWER"
        parts.append(f"{name.removeprefix(OPGATE_PREFIX)} {x:.2f}x {case['best_peer']} ({mark})")
    return "; ".join(parts)


def markdown(data: Mapping[str, Any]) -> list[str]:
    """Tables of ``bench.json``; % is of the copy ceiling measured in the same run."""
    ceil = data["ceilings"]
    lines = header("opgate op benchmarks", data["info"])
    method = (
        f"Medians of CUDA-event timings, L2 flushed before every repetition, all peers of a row "
        f"interleaved. Copy ceiling {ceil['copy_gbps']:.0f} GB/s (device-to-device, read + write), "
        f"bf16 GEMM {ceil['gemm_tflops']:.0f} TFLOP/s. Wall time {data['wall_s']} s."
    )
    lines += [method, ""]
    ops: dict[str, list[Mapping[str, Any]]] = {}
    for case in data["cases"]:
        ops.setdefault(case["op"], []).append(case)
    for op, cases in ops.items():
        names: list[str] = []
        for case in cases:
            names += [n for n in (*case["results"], *case["errors"]) if n not in names and n != "cost"]
        names.sort(key=lambda n: (not n.startswith(OPGATE_PREFIX), n))
        rows = [
            [
                "x".join(map(str, c["shape"])), c["dtype"], c["direction"],
                *(_cell(c["results"].get(n), c["errors"].get(n)) for n in names), _verdict(c),
            ]
            for c in cases
        ]  # fmt: skip
        lines += [f"## {op}", ""]
        lines += table(["shape", "dtype", "dir", *names, "opgate vs best peer"], rows)
        left_out = data["unavailable"].get(op) or {}
        lines += [""] + [f"- {name}: {why}" for name, why in left_out.items()] + [""]
    return lines
