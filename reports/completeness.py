"""Is a published matrix complete?  The cells a run planned and did not finish, said everywhere.

A run knows its plan (``results.json``'s ``planned`` and ``missing``, see
:class:`~validators.result.RunResults`); an interrupted run that was
collected lists the cells it never finished.  Publishing that as if it were
whole reads as "these cells do not exist", not "these cells were never
tested".  So the missing cells travel into ``compat.json`` (``missing``),
and compat.md, index.html and the terminal summary open with one notice
built here; ``publish --strict`` refuses to publish at all.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from html import escape

from opgate.validators.result import RunResults

SHOWN = 10


def missing_cells(runs: Iterable[RunResults]) -> list[str]:
    """Cells some run planned and no run produced (a re-run elsewhere fills the gap)."""
    runs = list(runs)
    present = {c.id for run in runs for c in run.cells}
    return sorted({m for run in runs for m in run.missing} - present)


def notice(missing: Sequence[str]) -> str:
    """One line for a terminal or a Markdown quote; "" when nothing is missing."""
    if not missing:
        return ""
    shown = ", ".join(missing[:SHOWN])
    more = f" and {len(missing) - SHOWN} more" if len(missing) > SHOWN else ""
    return (
        f"INCOMPLETE: {len(missing)} planned cell(s) have no verdict (a run was interrupted or "
        f"cut short): {shown}{more}"
    )


def markdown_notice(missing: Sequence[str]) -> list[str]:
    """Lines for compat.md (a quote block, then a blank line), or none."""
    text = notice(missing)
    return [f"> **{text.split(':', 1)[0]}:**{text.split(':', 1)[1]}", ""] if text else []


def html_notice(missing: Sequence[str]) -> str:
    """A banner for index.html (every missing id in a folded list), or ""."""
    if not missing:
        return ""
    items = "".join(f"<li><code>{escape(c)}</code></li>" for c in missing)
    return (
        f'<p class="incomplete" role="alert"><strong>Incomplete:</strong> {len(missing)} planned '
        f"cell(s) have no verdict (a run was interrupted or cut short).</p>"
        f"<details><summary>missing cells</summary><ul>{items}</ul></details>"
    )
