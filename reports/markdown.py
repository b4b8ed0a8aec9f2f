"""compat.md: the compatibility table for release notes.

Modelled on PyTorch's "Release Compatibility Matrix": one compact summary
table (rows op/implementation, columns environment), then one table per op,
then every cell that did not pass with its one-line reason, so a release
manager can paste it and a reader can see *why* a slot is not green.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence

from opgate.reports.compat import Compat
from opgate.reports.completeness import markdown_notice
from opgate.reports.envs import column_of
from opgate.reports.merge import Entry
from opgate.reports.view import (
    BUCKETS,
    ICONS,
    SEVERITY,
    Column,
    bucket,
    columns,
    environment_notes,
    format_counts,
    one_line_reason,
    resolved,
    row_of,
)
from opgate.reports.worth import markdown_section as worth_section

LIST_LIMIT = 200  # per category; compat.json and index.html hold the rest

LEGEND = f"""\
**Legend**

- {ICONS["pass"]} pass — every applicable check passed: numbers against the PyTorch reference and a \
float64 oracle, and the op's own kernel (GPU) or op event (CPU) seen in the profiler.
- {ICONS["fallback"]} fallback — numbers right, but the op's own kernel did not run, or extra copy \
kernels ran.
- {ICONS["fail"]} fail — wrong numbers or a failing check; crashes, timeouts (error) and flaky \
results count here too.
- {ICONS["untested"]} untested — could not run in that environment (no such device, toolkit or package).
- {ICONS["unsupported"]} unsupported — declared unsupported in the op's spec, and the op refused it with \
a clear error (shown only where present).
- {ICONS["environment"]} environment — the mode is broken in that environment: the op's own reference, \
run through the same mode by the same machinery (its *control*), fails the same way, so the op is not \
blamed (shown only where present; the column header names the broken modes, "Environment notes" says why).
- Columns are torch / CUDA / arch. **A GPU name**, e.g. "(H200)": runtime cells *ran on that GPU* (a \
device of that compute capability). **"(binary only)"**: no such GPU ran; the arch is *verified in \
the binary* only (`build` cells: the compiled kernels hold SASS/PTX for that arch, checked with cuobjdump).
- Counts are cells (dtype x layout x mode x shape set). A cell reported by several machines counts \
once, with its worst verdict.
"""


def _esc(text: str) -> str:
    """Table-safe Markdown: no pipes or newlines breaking rows, no raw HTML (``<!--`` hides the rest)."""
    text = " ".join(text.split()).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return text.replace("|", "\\|")


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(_esc(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return lines


def _grid(entries: Iterable[Entry], row_key: str, cols: dict[str, Column], compact: bool) -> list[list[str]]:
    grid: dict[str, dict[str, Counter[str]]] = defaultdict(lambda: defaultdict(Counter))
    for entry in entries:
        cell = entry.result.cell
        row = row_of(entry.result) if row_key == "op" else f"{cell.mode} · {cell.dtype}"
        grid[row][column_of(cell)][bucket(entry.result.verdict)] += 1
    return [
        [_esc(row), *(format_counts(grid[row][c], compact=compact) for c in cols)] for row in sorted(grid)
    ]


def _non_pass(entries: Sequence[Entry]) -> list[str]:
    """Every non-pass verdict (per environment); untested ones grouped by reason to stay short."""
    lines = ["## Cells that did not pass", ""]
    by_bucket: dict[str, list[Entry]] = defaultdict(list)
    for entry in entries:
        by_bucket[bucket(entry.result.verdict)].append(entry)
    if not any(by_bucket[b] for b in BUCKETS if b != "pass"):
        return [*lines, "Every cell passed.", ""]
    for name in ("fail", "fallback", "unsupported"):
        group = sorted(by_bucket[name], key=lambda e: (SEVERITY.index(e.result.verdict), e.key))
        if not group:
            continue
        lines += [f"### {ICONS[name]} {name} ({len(group)})", ""]
        for entry in group[:LIST_LIMIT]:
            verdict = entry.result.verdict.value
            reason = _esc(one_line_reason(entry.result)) or "no reason recorded"
            lines.append(f"- `{entry.result.id}` ({verdict}, env `{entry.env_key}`): {reason}")
        if len(group) > LIST_LIMIT:
            lines.append(f"- … {len(group) - LIST_LIMIT} more in compat.json")
        lines.append("")
    broken = by_bucket["environment"]
    if broken:
        lines += [f"### {ICONS['environment']} environment ({len(broken)}), by mode", ""]
        modes: dict[tuple[str, str], list[str]] = defaultdict(list)
        for entry in broken:
            modes[(entry.result.cell.mode, entry.env_key)].append(entry.result.id)
        for (mode, env), ids in sorted(modes.items()):
            example = f"e.g. `{ids[0]}`"
            lines.append(f"- {len(ids)} {mode} cell(s) in env `{env}`: the mode is broken there ({example})")
        lines.append("")
    untested = by_bucket["untested"]
    if untested:
        lines += [f"### {ICONS['untested']} untested ({len(untested)}), by reason", ""]
        reasons: dict[str, list[str]] = defaultdict(list)
        for entry in untested:
            reasons[one_line_reason(entry.result) or "no reason recorded"].append(entry.result.id)
        for reason, ids in sorted(reasons.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            lines.append(f"- {len(ids)} cell(s): {_esc(reason)} (e.g. `{ids[0]}`)")
        lines.append("")
    return lines


def _environment_section(compat: Compat) -> list[str]:
    """The environment column notes: per column and mode, what the controls found."""
    notes = environment_notes(compat.entries)
    if not notes:
        return []
    lines = ["## Environment notes", ""]
    for note in notes:
        shown = ", ".join(f"`{c}`" for c in note.controls[:3]) + (" …" if len(note.controls) > 3 else "")
        lines.append(
            f"- **{_esc(note.column)} · {_esc(note.mode)}**: broken in this environment, "
            f"{note.cells} op cell(s) not blamed; the ops' own references fail the same way "
            f"({_esc(note.reason) or 'no reason recorded'}); controls: {shown or 'none recorded'}"
        )
    return [*lines, ""]


def render(compat: Compat) -> str:
    """The whole compat.md."""
    cols = columns(compat.entries, compat.environments)
    slots = list(resolved(compat.entries).values())
    header = ["op / implementation", *(c.label for c in cols.values())]
    lines = [
        "# opgate compatibility matrix",
        "",
        (
            f"Published {compat.generated_at} from {len(compat.sources) or 'earlier'} result file(s): "
            f"{len(slots)} cells, {len(compat.entries)} verdicts in {len(compat.environments)} "
            "environment(s)."
        ),
        "",
        *markdown_notice(compat.missing),
        LEGEND,
        "## Summary",
        "",
        *_table(header, _grid(slots, "op", cols, compact=False)),
        "",
        *_environment_section(compat),
    ]
    ops: dict[str, list[Entry]] = defaultdict(list)
    for entry in slots:
        ops[row_of(entry.result)].append(entry)
    for op, group in sorted(ops.items()):
        used = {column_of(e.result.cell) for e in group}
        op_cols = {k: c for k, c in cols.items() if k in used}
        lines += [f"## {op}", ""]
        lines += _table(
            ["mode · dtype", *(c.label for c in op_cols.values())], _grid(group, "mode", op_cols, True)
        )
        lines.append("")
    lines += worth_section(compat.entries)
    lines += _non_pass(compat.entries)
    return "\n".join(lines).rstrip() + "\n"
