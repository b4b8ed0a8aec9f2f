"""The published benchmark table: one Markdown table per op from benchmark JSON files.

Benchmarks run on the GPU machine (``python -m opgate.ops.<op>.bench --out FILE`` or
``opgate perf bench``) and their JSON is committed; this module
renders it for release notes and the dashboard, never measures anything.  Each
row is one (shape, dtype, direction); columns are the implementations timed in
the same run (opgate's, aten, torch.compile of the reference, Liger-Kernel),
as microseconds and % of the device-to-device copy bandwidth measured in that
run.  The best time of each row is bold, and a row where opgate is not the
fastest says by how much it trails — misses are shown, not hidden.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from opgate.matrix.errors import ResultsFormatError

OURS_PREFIX = "opgate"


def load(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Benchmark documents ``{"meta": {...}, "op": str, "rows": [...]}``, sorted by op."""
    docs = []
    for path in sorted(paths):
        try:
            doc = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ResultsFormatError(f"{path}: unreadable benchmark file: {exc}") from exc
        if not isinstance(doc, dict) or not {"meta", "op", "rows"} <= doc.keys():
            raise ResultsFormatError(f"{path}: not a benchmark document (needs meta, op, rows)")
        docs.append(doc)
    return sorted(docs, key=lambda d: str(d["op"]))


def _cell(row: dict[str, Any], best: float) -> str:
    text = f"{row['us']:.1f} us"
    if row.get("pct_copy") is not None:
        text += f" ({row['pct_copy']:.0f}%)"  # already a percentage of the copy ceiling
    return f"**{text}**" if row["us"] <= best else text


def render_op(doc: dict[str, Any]) -> str:
    """One op's table; rows with host-side directions (``host-*``) are left out."""
    rows = [r for r in doc["rows"] if not str(r["direction"]).startswith("host")]
    failed = [r for r in rows if not isinstance(r.get("us"), (int, float))]
    rows = [r for r in rows if r not in failed]
    impls = sorted({r["impl"] for r in rows}, key=lambda i: (not i.startswith(OURS_PREFIX), i))
    groups: dict[tuple[str, str, str], dict[str, dict[str, Any]]] = defaultdict(dict)
    for r in rows:
        groups[(r["shape"], r["dtype"], r["direction"])][r["impl"]] = r
    meta = doc["meta"]
    lines = [
        f"### {doc['op']}",
        "",
        (
            f"{meta.get('device', '?')} ({meta.get('capability', '?')}), torch {meta.get('torch', '?')}, "
            f"triton {meta.get('triton', '?')}, {meta.get('date', '?')[:10]}; "
            f"copy ceiling {meta.get('copy_gbps', 0):.0f} GB/s. {meta.get('method', '')}"
        ),
        "",
        "| shape | dtype | dir | " + " | ".join(impls) + " | opgate vs best peer |",
        "|---|---|---|" + "---|" * len(impls) + "---|",
    ]
    for (shape, dtype, direction), by_impl in sorted(groups.items(), key=_order):
        best = min(r["us"] for r in by_impl.values())
        cells = [_cell(by_impl[i], best) if i in by_impl else "–" for i in impls]
        row = " | ".join([shape, dtype, direction, *cells, _verdict(by_impl)])
        lines.append(f"| {row} |")
    lines.extend(_untimed(r) for r in failed)
    return "\n".join(lines) + "\n"


def _untimed(r: dict[str, Any]) -> str:
    return f"\n- not timed: {r['impl']} {r['shape']} {r['direction']}: {r.get('error', '?')}"


def shape_size(shape: str) -> int:
    """Elements of a benchmark shape label: ``"32768x8192"``, ``"4x4096x32x128 bhsd"``."""
    return math.prod(int(p) for p in shape.split(maxsplit=1)[0].split("x") if p.isdigit())


def _order(item: tuple[tuple[str, str, str], Any]) -> tuple[int, str, str]:
    (shape, dtype, direction), _ = item
    return shape_size(shape), dtype, direction


def _verdict(by_impl: dict[str, dict[str, Any]]) -> str:
    ours = [r["us"] for i, r in by_impl.items() if i.startswith(OURS_PREFIX) and "compiled" not in i]
    peers = [r["us"] for i, r in by_impl.items() if not i.startswith(OURS_PREFIX)]
    if not ours or not peers:
        return "–"
    ratio = min(ours) / min(peers)
    return "fastest" if ratio <= 1.0 else f"{100 * (ratio - 1):.0f}% slower"


def render(docs: list[dict[str, Any]]) -> str:
    head = [
        "# opgate benchmark table",
        "",
        (
            "Medians with the L2 flushed; % = share of the measured device-to-device copy bandwidth. "
            "Bold: the fastest in the row."
        ),
        "",
    ]
    return "\n".join(head) + "\n" + "\n".join(render_op(d) for d in docs)
