"""index.html: the dashboard of one compat document, which it loads from ``compat.json`` beside it.

The page holds no verdicts.  Its script fetches ``compat.json`` from the same
folder, so the published page stays under 200 KB however large the matrix grows,
and the one file every tool reads is the one file the page reads.  What the
page needs besides the data, and what only Python knows (column labels with
the GPU that ran them, verdict buckets and glyphs, the severity order), sits
in a small inline ``layout`` block (the modes' order and summaries come with
the data: compat.json ``modes``); the summary table and the
perf charts are rendered here, at publish time.

Opened from ``file://``, browsers refuse ``fetch`` of a neighbouring file.
The page then says so and offers a file picker for ``compat.json`` (a
``FileReader`` may read a file the user chose), besides the command that
serves the folder over HTTP.

The layout block is the one injection risk: a column label holding
``</script>`` would end it early.  :func:`embed_json` escapes ``<``, ``>``
and ``&`` as JSON unicode escapes, which ``JSON.parse`` reads back
unchanged; the script renders every string through ``textContent``.
"""

from __future__ import annotations

import json
from html import escape
from pathlib import Path
from typing import Any

from opgate.reports.charts import perf_section
from opgate.reports.compat import COMPAT_SCHEMA_VERSION, Compat
from opgate.reports.completeness import html_notice
from opgate.reports.envs import column_of
from opgate.reports.view import (
    BUCKETS,
    CELL_ANCHOR,
    GLYPHS,
    SEVERITY,
    bucket,
    columns,
    counts,
    environment_notes,
    format_counts,
    resolved,
    row_of,
)
from opgate.reports.worth import html_section as worth_section
from opgate.validators.env import Fingerprint
from opgate.validators.result import Verdict

STATIC = Path(__file__).parent / "static"
#: Inlined in this order: the evidence renderer is used by the dashboard script.
SCRIPTS = ("evidence.js", "dashboard.js")
DATA_FILE = "compat.json"
#: The command the page shows for viewing a published folder over HTTP.
SERVE_HINT = "python3 -m http.server --directory DIR 8000   # then open http://localhost:8000/"


def embed_json(data: Any) -> str:
    """JSON safe inside a ``<script>`` element (no ``</script>``, ``<!--``, or U+2028/9 surprises)."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    for raw, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
        text = text.replace(raw, escaped)
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def _axes_key(torch: str, cuda: str, arch: str) -> str:
    return f"{torch}|{cuda}|{arch}"


def layout(compat: Compat) -> dict[str, Any]:
    """What the page's script needs besides compat.json: labels and orders only Python knows."""
    cols = columns(compat.entries, compat.environments)
    column_of_axes = {
        _axes_key(e.result.cell.torch, e.result.cell.cuda, e.result.cell.arch): column_of(e.result.cell)
        for e in compat.entries
    }
    return {
        "data": DATA_FILE,
        "schema_version": COMPAT_SCHEMA_VERSION,
        "generated_at": compat.generated_at,
        "cells": len(compat.entries),
        "columns": [{"name": c.name, "label": c.label} for c in cols.values()],
        "column_of": dict(sorted(column_of_axes.items())),
        "gpus": {key: Fingerprint.from_json(fp).gpu_name or "" for key, fp in compat.environments.items()},
        "buckets": {v.value: bucket(v) for v in Verdict},
        "bucket_order": list(BUCKETS),
        "glyphs": dict(GLYPHS),
        "severity": [v.value for v in SEVERITY],
        "anchor": CELL_ANCHOR,
        "serve_hint": SERVE_HINT,
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


def _static(name: str) -> str:
    return (STATIC / name).read_text(encoding="utf-8")


def _environment_notes(compat: Compat) -> str:
    """The environment column notes (see :func:`reports.view.environment_notes`), as a list."""
    items = [
        f"<li><strong>{escape(n.column)} · {escape(n.mode)}</strong>: broken in this environment, "
        f"{n.cells} op cell(s) not blamed; the ops' own references fail the same way "
        f"({escape(n.reason or 'no reason recorded')}); "
        f"controls: {escape(', '.join(n.controls) or 'none')}</li>"
        for n in environment_notes(compat.entries)
    ]
    return f'<h3>Environment notes</h3><ul class="env-notes">{"".join(items)}</ul>' if items else ""


def render(compat: Compat, block_section: str = "") -> str:
    """The whole page; ``block_section``: the decoder-block comparison's HTML, when published."""
    js = "\n".join(_static(name) for name in SCRIPTS)
    title = f"opgate compatibility matrix · {compat.generated_at}"
    block = f'<section id="block"><h2>End to end: decoder block</h2>{block_section}</section>'
    worth = worth_section(compat.entries)
    if worth:
        worth = (
            f'<section id="worth"><h2>Worth it? The op against PyTorch in the same mode</h2>{worth}</section>'
        )
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; \
script-src 'unsafe-inline'; img-src data:; connect-src 'self'">
<title>{escape(title)}</title>
<style>{_static("dashboard.css")}</style>
</head>
<body>
<header>
<h1>opgate compatibility matrix</h1>
<p class="muted">Published {escape(compat.generated_at)} · {len(compat.entries)} verdicts in \
{len(compat.environments)} environment(s). Click a cell for its evidence; every cell has a link \
of its own (<code>index.html#{escape(CELL_ANCHOR)}CELL-ID</code>).</p>
{html_notice(compat.missing)}
</header>
<main>
<section id="summary"><h2>Summary</h2>{_summary_table(compat)}
<p class="muted legend">✓ pass · ⚠ fallback (numbers right, own kernel not seen) · ✗ fail / error / \
flaky · – untested here · ⊘ declared unsupported · ⚑ environment (the mode is broken there: the op's \
own reference fails the same way). "(binary only)": arch verified in the binary \
(build cells), no such GPU ran; a GPU name: runtime cells ran on that GPU.</p>
{_environment_notes(compat)}</section>
<section id="matrix-section"><h2>Matrix</h2>
<div id="load-status" data-state="loading" role="status">Loading {DATA_FILE}…</div>
<form id="filters" autocomplete="off"></form>
<p id="count" class="muted"></p>
<div id="matrix-wrap"><table id="matrix"></table></div>
</section>
<aside id="details" hidden aria-live="polite"></aside>
<section id="perf"><h2>Performance</h2>{perf_section(compat.perf)}</section>
{worth}
{block if block_section else ""}
</main>
<script type="application/json" id="opgate-layout">{embed_json(layout(compat))}</script>
<script>{js}</script>
</body>
</html>
"""
