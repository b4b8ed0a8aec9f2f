"""Worth it?  The perf check's verdict on each op against what PyTorch gives in the same mode.

Read from the ``perf`` check's ``details["worth_it"]`` (written by
``validators/checks/perf_worth.py``, judged by ``validators/perf/worth.py``):
per op/implementation, environment and mode, the worst row's ratio (op time
over the best baseline's) and finding.  ``slower`` is a perf finding, shown
beside the correctness verdicts, never counted as a failure.  compat.md and
index.html render the same rows (:func:`markdown_section`, :func:`html_section`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from html import escape
from typing import Any

from opgate.matrix.modes import MODES as ALL_MODES
from opgate.reports.envs import column_of, column_sort_key
from opgate.reports.merge import Entry
from opgate.reports.perf import PERF_CHECK
from opgate.reports.view import row_of
from opgate.validators.perf.worth import FINDINGS, SLOWER

#: The timed modes (:attr:`opgate.matrix.modes.Mode.timed`): the worth-it table's columns.
MODES = tuple(name for name, m in ALL_MODES.items() if m.timed)


def worth_rows(entries: Iterable[Entry]) -> list[dict[str, Any]]:
    """One row per cell with a worth-it summary: op/impl, environment column, mode, dtype, the summary.

    A cell without a summary (nothing timed) has no row.  A summary that is there but
    malformed never gets here: the results and compat files are refused as they are read
    (:func:`reports.perf.refuse_bad_perf`), since a left-out row reads as "not timed" and could
    hide a ``slower`` finding.
    """
    rows = []
    for entry in entries:
        check = entry.result.check(PERF_CHECK)
        record = check.details.get("worth_it") if check is not None else None
        if not isinstance(record, Mapping) or not isinstance(record.get("summary"), Mapping):
            continue
        cell = entry.result.cell
        rows.append(
            {**record["summary"], "row": row_of(entry.result), "column": column_of(cell), "mode": cell.mode,
             "dtype": cell.dtype, "context": record.get("context")}
        )  # fmt: skip
    return rows


def _worst(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return max(rows, key=lambda r: (-FINDINGS.index(r["finding"]), r["ratio"]))


def grid(rows: Iterable[Mapping[str, Any]]) -> dict[str, dict[tuple[str, str], dict[str, Any]]]:
    """column -> (op/impl, mode) -> the worst row over dtypes."""
    groups: dict[str, dict[tuple[str, str], list[dict[str, Any]]]] = {}
    for r in rows:
        groups.setdefault(r["column"], {}).setdefault((r["row"], r["mode"]), []).append(dict(r))
    return {col: {k: _worst(v) for k, v in cells.items()} for col, cells in groups.items()}


def label(r: Mapping[str, Any]) -> str:
    """``2.05x compile(reference), slower``: the op's time over the best baseline's."""
    return f"{r['ratio']:.2f}x {r['best']}, {r['finding']}"


def _shape(r: Mapping[str, Any]) -> str:
    shape = r.get("shape")
    text = "x".join(str(d) for d in shape) if isinstance(shape, (list, tuple)) else str(shape or "")
    return f"{text} {r.get('direction') or ''}".strip()


INTRO = (
    "The perf check times each op against what PyTorch already gives in the same mode: in eager the "
    "reference, the stock aten op and `torch.compile(reference)`; under compile and cudagraphs "
    "`torch.compile` of the reference, both inside the graph the correctness checks run the op in. "
    "Cells are the op's time over the best baseline's, worst over shapes, forward and forward+backward "
    "(below 1: faster). **slower** means a team gets more speed from stock PyTorch in that mode: a perf "
    "finding, not a failure."
)


def markdown_section(entries: Iterable[Entry]) -> list[str]:
    """The compat.md section (empty when no cell was timed)."""
    rows = worth_rows(entries)
    if not rows:
        return []
    lines = ["## Worth it? The op against PyTorch in the same mode", "", INTRO, ""]
    slower = []
    for column, cells in sorted(grid(rows).items(), key=lambda kv: column_sort_key(kv[0])):
        ops = sorted({k[0] for k in cells})
        lines += [
            f"### {column}",
            "",
            "| op / implementation | " + " | ".join(MODES) + " |",
            "|---|" + "---|" * len(MODES),
        ]
        for op in ops:
            cells_text = []
            for mode in MODES:
                r = cells.get((op, mode))
                if r is None:
                    cells_text.append("–")
                    continue
                text = label(r)
                cells_text.append(f"**{text}**" if r["finding"] == SLOWER else text)
                if r["finding"] == SLOWER:
                    slower.append(f"- `{op}` in {mode} ({column}): {label(r)} at {_shape(r)}")
            lines.append(f"| {op} | " + " | ".join(cells_text) + " |")
        lines.append("")
    if slower:
        lines += ["Slower than what PyTorch gives in that mode:", "", *slower, ""]
    return lines


def html_section(entries: Iterable[Entry]) -> str:
    """The index.html section (empty string when no cell was timed)."""
    rows = worth_rows(entries)
    if not rows:
        return ""
    parts = [f'<p class="muted">{escape(INTRO.replace("**", "").replace("`", ""))}</p>']
    for column, cells in sorted(grid(rows).items(), key=lambda kv: column_sort_key(kv[0])):
        head = "".join(f"<th>{escape(m)}</th>" for m in MODES)
        body = []
        for op in sorted({k[0] for k in cells}):
            tds = []
            for mode in MODES:
                r = cells.get((op, mode))
                if r is None:
                    tds.append("<td>–</td>")
                    continue
                title = escape(f"{_shape(r)}; context: {r.get('context') or '?'}", quote=True)
                cls = f"worth-{r['finding']}"
                tds.append(f'<td class="{cls}" title="{title}">{escape(label(r))}</td>')
            body.append(f"<tr><th>{escape(op)}</th>{''.join(tds)}</tr>")
        parts.append(
            f'<h3>{escape(column)}</h3><table class="worth"><thead><tr><th>op / implementation</th>{head}'
            f"</tr></thead><tbody>{''.join(body)}</tbody></table>"
        )
    return "".join(parts)
