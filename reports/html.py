"""index.html: a static, self-contained dashboard of one compat document.

One file, no network: CSS and JS are inlined from ``reports/static``, the data
sits in a ``<script type="application/json">`` block, perf charts are inline
SVG.  It opens from a CI artifact, a release asset or a local disk alike.

The data block is the one injection risk: a reason or kernel name containing
``</script>`` (or ``<!--``) would end the block early.  :func:`embed_json`
escapes ``<``, ``>`` and ``&`` as JSON unicode escapes, which ``JSON.parse``
reads back unchanged; the page renders every string through ``textContent``.
"""

from __future__ import annotations

import json
from html import escape
from pathlib import Path
from typing import Any

from opgate.reports.charts import perf_section
from opgate.reports.compat import Compat
from opgate.reports.envs import column_of
from opgate.reports.view import (
    GLYPHS,
    bucket,
    columns,
    counts,
    format_counts,
    one_line_reason,
    resolved,
    row_of,
)
from opgate.validators.env import Fingerprint

STATIC = Path(__file__).parent / "static"


def embed_json(data: Any) -> str:
    """JSON safe inside a ``<script>`` element (no ``</script>``, ``<!--``, or U+2028/9 surprises)."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    for raw, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
        text = text.replace(raw, escaped)
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def page_data(compat: Compat) -> dict[str, Any]:
    """What the page's script needs: one record per (cell, environment), plus labels."""
    cols = columns(compat.entries, compat.environments)
    cells = []
    for entry in compat.entries:
        result = entry.result
        cells.append(
            {
                "id": result.id,
                "row": row_of(result),
                "axes": result.cell.axes(),
                "column": column_of(result.cell),
                "env_key": entry.env_key,
                "verdict": result.verdict.value,
                "bucket": bucket(result.verdict),
                "reason": one_line_reason(result, limit=500),
                "checks": [c.to_json() for c in result.checks],
                "kernels": result.kernels,
                "repro": result.repro,
                "duration_s": round(result.duration_s, 3),
                "seed": result.seed,
                "attempts": result.attempts,
            }
        )
    return {
        "generated_at": compat.generated_at,
        "columns": [{"name": c.name, "label": c.label} for c in cols.values()],
        "environments": {
            k: {"gpu": Fingerprint.from_json(v).gpu_name or "", "fingerprint": v}
            for k, v in compat.environments.items()
        },
        "cells": cells,
    }


def _summary_table(compat: Compat) -> str:
    cols = columns(compat.entries, compat.environments)
    slots = list(resolved(compat.entries).values())
    rows = sorted({row_of(e.result) for e in slots})
    head = "".join(f"<th>{escape(c.label)}</th>" for c in cols.values())
    body = []
    for row in rows:
        tds = []
        for name in cols:
            group = [e for e in slots if row_of(e.result) == row and column_of(e.result.cell) == name]
            tds.append(f"<td>{escape(format_counts(counts(group), icons=GLYPHS))}</td>")
        body.append(f"<tr><th>{escape(row)}</th>{''.join(tds)}</tr>")
    return (
        f'<table class="summary"><thead><tr><th>op / implementation</th>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table>"
    )


def render(compat: Compat, block_section: str = "") -> str:
    """The whole page; ``block_section``: the decoder-block comparison's HTML, when published."""
    css = (STATIC / "dashboard.css").read_text()
    js = (STATIC / "dashboard.js").read_text()
    title = f"opgate compatibility matrix · {compat.generated_at}"
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; \
script-src 'unsafe-inline'; img-src data:">
<title>{escape(title)}</title>
<style>{css}</style>
</head>
<body>
<header>
<h1>opgate compatibility matrix</h1>
<p class="muted">Published {escape(compat.generated_at)} · {len(compat.entries)} verdicts in \
{len(compat.environments)} environment(s). Click a cell for its evidence.</p>
</header>
<main>
<section id="summary"><h2>Summary</h2>{_summary_table(compat)}
<p class="muted legend">✓ pass · ⚠ fallback (numbers right, own kernel not seen) · ✗ fail / error / \
flaky · – untested here · ⊘ declared unsupported. "(binary only)": arch verified in the binary \
(build cells), no such GPU ran; a GPU name: runtime cells ran on that GPU.</p></section>
<section id="matrix-section"><h2>Matrix</h2>
<form id="filters" autocomplete="off"></form>
<p id="count" class="muted"></p>
<div id="matrix-wrap"><table id="matrix"></table></div>
</section>
<aside id="details" hidden aria-live="polite"></aside>
<section id="perf"><h2>Performance</h2>{perf_section(compat.perf)}</section>
{f'<section id="block"><h2>End to end: decoder block</h2>{block_section}</section>' if block_section else ""}
</main>
<script type="application/json" id="opgate-data">{embed_json(page_data(compat))}</script>
<script>{js}</script>
</body>
</html>
"""
