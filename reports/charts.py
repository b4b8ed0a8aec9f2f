"""Perf charts as inline SVG (no script, no network): drawn once, at publish time.

Two views per op: the newest run's GB/s and % of roofline per implementation
and shape (bars), and, where a series has history, its GB/s (or time when no
bytes are declared) across runs (a line).  Static SVG keeps the dashboard a
single file that renders the same in any browser or in a CI artifact viewer.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from opgate.reports.perf import MIN_ROOFLINE_US, roofline_shown

BAR_W = 260
ROW_H = 22
LABEL_W = 330


def _fmt(value: float) -> str:
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def _bar(x: float, y: float, width: float, cls: str, title: str) -> str:
    return (
        f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(width, 1.0):.1f}" height="{ROW_H - 8}" class="{cls}">'
        f"<title>{escape(title)}</title></rect>"
    )


def _bar_order(s: Mapping[str, Any]) -> tuple[str, ...]:
    """Rows by (impl, dtype, mode, shape, GPU).  The schema makes the first three optional (series
    published before they were kept lack them), so a missing one sorts as empty, as it is labelled.
    """
    return tuple(str(s.get(k) or "") for k in ("impl", "dtype", "mode", "shape", "gpu"))


def bars(op: str, series: Sequence[Mapping[str, Any]]) -> str:
    """GB/s and % of roofline of each series' newest run, one row per (impl, dtype, mode, shape, GPU)."""
    rows = []
    for s in sorted(series, key=_bar_order):
        newest = s["runs"][-1]
        label = f"{s.get('impl', '')} {s.get('dtype', '')} {s.get('mode', '')} {s['shape']} {s['gpu']}"
        rows.append((label.strip(), newest))
    max_gbps = max((r.get("gbps", 0.0) for _, r in rows), default=0.0) or 1.0
    height = ROW_H * len(rows) + 30
    width = LABEL_W + 2 * BAR_W + 150
    parts = [
        (
            f'<svg class="chart" role="img" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
            f'aria-label="{escape(op)} GB/s and % of roofline">'
        ),
        f'<text x="{LABEL_W}" y="14" class="axis">GB/s (newest run)</text>',
        f'<text x="{LABEL_W + BAR_W + 70}" y="14" class="axis">% of roofline</text>',
    ]
    for i, (label, run) in enumerate(rows):
        y = 24 + i * ROW_H
        parts.append(f'<text x="0" y="{y + 11}" class="label">{escape(label)}</text>')
        gbps = run.get("gbps")
        time_note = f"median {_fmt(run['median_us'])} us"
        if gbps is not None:
            w = BAR_W * gbps / max_gbps
            parts.append(_bar(LABEL_W, y, w, "bar-gbps", f"{label}: {_fmt(gbps)} GB/s, {time_note}"))
            parts.append(f'<text x="{LABEL_W + w + 4:.1f}" y="{y + 11}" class="value">{_fmt(gbps)}</text>')
        else:
            parts.append(f'<text x="{LABEL_W}" y="{y + 11}" class="value">{escape(time_note)}</text>')
        baseline = run.get("baseline") or {}
        if isinstance(baseline.get("gbps"), (int, float)):
            bx = LABEL_W + BAR_W * float(baseline["gbps"]) / max_gbps
            name = str(baseline.get("name", "baseline"))
            parts.append(
                f'<line x1="{bx:.1f}" x2="{bx:.1f}" y1="{y - 2}" y2="{y + ROW_H - 6}" class="baseline">'
                f"<title>{escape(name)}: {_fmt(float(baseline['gbps']))} GB/s</title></line>"
            )
        pct = roofline_shown(run)
        x0 = LABEL_W + BAR_W + 70
        if pct is not None:
            w = BAR_W * min(pct, 100.0) / 100.0 * 0.6
            parts.append(_bar(x0, y, w, "bar-roof", f"{label}: {pct:.1f}% of roofline"))
            parts.append(f'<text x="{x0 + w + 4:.1f}" y="{y + 11}" class="value">{pct:.0f}%</text>')
        elif run.get("roofline_pct") is not None:
            why = (
                f"{label}: its bytes and FLOPs take {_fmt(float(run['ideal_us']))} us at the measured "
                f"ceilings, under {MIN_ROOFLINE_US:.0f} us: the launch, not the kernel, sets its time"
            )
            parts.append(
                f'<text x="{x0}" y="{y + 11}" class="value na">n/a (shape too small)'
                f"<title>{escape(why)}</title></text>"
            )
    parts.append("</svg>")
    return "".join(parts)


def history(series: Mapping[str, Any], width: int = 360, height: int = 110) -> str:
    """One series across runs: GB/s when known, else median time (lower is better)."""
    runs = series["runs"]
    metric = "gbps" if all("gbps" in r for r in runs) else "median_us"
    unit = "GB/s" if metric == "gbps" else "us"
    values = [float(r[metric]) for r in runs]
    lo, hi = min(values), max(values)
    span = (hi - lo) or max(hi * 0.05, 1e-9)
    pad_l, pad_r, pad_t, pad_b = 48, 10, 18, 18
    inner_w, inner_h = width - pad_l - pad_r, height - pad_t - pad_b

    def xy(i: int, v: float) -> tuple[float, float]:
        x = pad_l + (inner_w * i / (len(values) - 1) if len(values) > 1 else inner_w / 2)
        y = pad_t + inner_h * (1 - (v - lo) / span)
        return x, y

    points = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(i, v) for i, v in enumerate(values)))
    title = f"{series['cell']} {series['shape']} {series['gpu']}"
    caption = f"{series['shape']} · {unit} over {len(values)} runs"
    parts = [
        (
            f'<svg class="chart history" role="img" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" aria-label="{escape(title)} history">'
        ),
        f'<text x="{pad_l}" y="12" class="axis">{escape(caption)}</text>',
        f'<text x="2" y="{pad_t + 8}" class="value">{_fmt(hi)}</text>',
        f'<text x="2" y="{height - pad_b}" class="value">{_fmt(lo)}</text>',
        f'<polyline points="{points}" class="line"/>',
    ]
    for i, (run, value) in enumerate(zip(runs, values, strict=True)):
        x, y = xy(i, value)
        parts.append(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" class="dot">'
            f"<title>{escape(str(run.get('run', '')))}: {_fmt(value)} {unit}</title></circle>"
        )
    parts.append("</svg>")
    return "".join(parts)


def perf_section(perf: Mapping[str, Any]) -> str:
    """All charts, grouped by op; a sentence when no perf was recorded (CPU-only runs)."""
    series = list(perf.get("series") or [])
    if not series:
        return '<p class="muted">No perf figures: perf is measured on GPU cells only.</p>'
    by_op: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for s in series:
        by_op[str(s.get("op") or s["cell"].split(".")[0])].append(s)
    out = []
    for op in sorted(by_op):
        group = by_op[op]
        out.append(f'<section class="perf-op" data-op="{escape(op)}"><h3>{escape(op)}</h3>')
        out.append(bars(op, group))
        with_history = [s for s in group if len(s["runs"]) > 1]
        if with_history:
            out.append('<div class="histories">')
            out.extend(history(s) for s in sorted(with_history, key=lambda s: (s["cell"], s["shape"])))
            out.append("</div>")
        out.append("</section>")
    return "".join(out)
