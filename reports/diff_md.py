"""A diff as GitHub-flavoured Markdown: a PR comment or a GITHUB_STEP_SUMMARY.

GitHub drops a step summary above 1024 KiB ("upload aborted") and caps comments
at 65536 characters, so the renderer works to a byte budget: headline and
section headers always fit, table rows are cut with a count of what was left
out and a pointer to the full report.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from opgate.reports.view import cell_url

STEP_SUMMARY_LIMIT = 1024 * 1024
DEFAULT_BUDGET = STEP_SUMMARY_LIMIT - 24 * 1024  # headroom for other steps' summaries

_SECTIONS: tuple[tuple[str, str], ...] = (
    ("new_failures", "❌ New failures"),
    ("new_fallbacks", "⚠️ New fallbacks"),
    ("perf_regressions", "📉 Perf regressions"),
    ("fixes", "✅ Fixed"),
    ("became_untested", "– Became untested"),
    ("environment", "🌐 Mode broken by the environment"),
    ("other_changes", "↔ Other verdict changes"),
)


def _esc(text: Any) -> str:
    """One table-safe line; no raw HTML (a reason holding ``<!--`` would hide the rest of the comment)."""
    line = " ".join(str(text).split()).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return line.replace("|", "\\|")


def _cell(cell_id: str, dashboard_url: str) -> str:
    """The cell id, linked to its evidence on the published dashboard when there is one."""
    return f"[`{cell_id}`]({cell_url(dashboard_url, cell_id)})" if dashboard_url else f"`{cell_id}`"


def _change_row(c: Mapping[str, Any], dashboard_url: str = "") -> str:
    reason = _esc(c.get("reason") or "")
    cell = _cell(c["cell"], dashboard_url)
    return f"| {cell} | {_esc(c['device'])} | {c['base'] or '—'} → {c['head'] or '—'} | {reason} |"


def _perf_row(r: Mapping[str, Any], dashboard_url: str = "") -> str:
    return (
        f"| {_cell(r['cell'], dashboard_url)} | {_esc(r['gpu'])} | {_esc(r['shape'])} | "
        f"{r['base_median_us']:.1f} us | {r['head_median_us']:.1f} us | {r['change'] * 100:+.1f}% | "
        f"{r['p_value']:.1e} |"
    )


_HEADERS = {
    "perf_regressions": (
        "| cell | GPU | shape | base median | head median | change | p |\n|---|---|---|---|---|---|---|"
    ),
}
_CHANGE_HEADER = "| cell | device | base → head | reason |\n|---|---|---|---|"


def render(
    doc: Mapping[str, Any], report_url: str = "", budget: int = DEFAULT_BUDGET, dashboard_url: str = ""
) -> str:
    """Markdown for a JSON diff document, never longer than ``budget`` bytes (UTF-8).

    ``dashboard_url``: the published index.html; each cell id links to its evidence there.
    """
    summary = doc["summary"]
    rule = doc["rule"]
    counts = " · ".join(f"{title} **{summary.get(key, 0)}**" for key, title in _SECTIONS)
    head = [
        "## opgate: compatibility diff",
        "",
        (
            f"base `{_esc(doc['base']['path'])}` ({doc['base']['generated_at']}) → "
            f"head `{_esc(doc['head']['path'])}` ({doc['head']['generated_at']})"
        ),
        "",
        counts,
        "",
    ]
    if summary.get("regressions", 0) == 0:
        head += ["No regressions.", ""]
    footer = [
        "",
        (
            f"<sub>Perf rule: one-sided Mann-Whitney U, p < {rule['alpha']}, and a median change of at "
            f"least {rule['min_effect'] * 100:.0f}% (>= {rule['min_samples']} samples per side).</sub>"
        ),
    ]
    if report_url:
        footer[1:1] = [f"Full report: {report_url}", ""]
    out = "\n".join(head)
    tail = "\n".join(footer) + "\n"
    used = len(out.encode()) + len(tail.encode())
    for key, title in _SECTIONS:
        rows: Sequence[Mapping[str, Any]] = doc.get(key) or []
        if not rows:
            continue
        header = f"### {title} ({len(rows)})\n\n{_HEADERS.get(key, _CHANGE_HEADER)}\n"
        reserve = 200  # room for this section's "... more" line
        if used + len(header.encode()) + reserve > budget:
            out += f"\n### {title} ({len(rows)}): left out, see the full report\n"
            used += 80
            continue
        out += "\n" + header
        used += len(header.encode()) + 1
        render_row = _perf_row if key == "perf_regressions" else _change_row
        for shown, row in enumerate(rows):
            line = render_row(row, dashboard_url) + "\n"
            if used + len(line.encode()) + reserve > budget:
                where = f" at {report_url}" if report_url else " in the JSON diff"
                out += f"\n… {len(rows) - shown} more row(s) left out; see the full list{where}.\n"
                used += 120
                break
            out += line
            used += len(line.encode())
    return out + tail
