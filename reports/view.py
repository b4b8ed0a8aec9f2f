"""The table model every renderer shares: buckets, columns, one-line reasons.

Markdown, HTML, the terminal summary and the diff must agree on what counts as
"fail" and what a column is called, so those decisions live here once.

Columns are release-table environments (torch major.minor / CUDA / arch).  A
GPU column says which evidence it holds: runtime cells that ran on a device of
that capability ("ran on that GPU": the GPU name is in the label), or only
``build`` cells ("binary only": the binary holds code for the arch, checked
with cuobjdump on a machine without such a GPU).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from opgate.reports.envs import column_of, column_sort_key
from opgate.reports.merge import Entry
from opgate.validators.env import Fingerprint
from opgate.validators.result import CellResult, Verdict

BUCKETS: tuple[str, ...] = ("pass", "fallback", "fail", "untested", "unsupported", "environment")
#: Buckets a count shows only where present (declared refusals, modes the environment broke).
OPTIONAL_BUCKETS = frozenset({"unsupported", "environment"})
ICONS = {
    "pass": "✅",
    "fallback": "⚠️",
    "fail": "❌",
    "untested": "–",
    "unsupported": "🚫",
    "environment": "🌐",
}
#: Glyphs for the dashboard: present in common text fonts, so a machine without an emoji
#: font (a CI container, a headless browser) still shows them.
GLYPHS = {"pass": "✓", "fallback": "⚠", "fail": "✗", "untested": "–", "unsupported": "⊘", "environment": "⚑"}
_BUCKET_OF = {
    Verdict.PASS: "pass",
    Verdict.FALLBACK: "fallback",
    Verdict.FAIL: "fail",
    Verdict.ERROR: "fail",
    Verdict.FLAKY: "fail",
    Verdict.SKIP: "untested",
    Verdict.UNSUPPORTED: "unsupported",
    Verdict.ENVIRONMENT: "environment",
}
#: Worst first: which verdict a cell shows when several environments report it.
SEVERITY: tuple[Verdict, ...] = (
    Verdict.ERROR,
    Verdict.FAIL,
    Verdict.FLAKY,
    Verdict.FALLBACK,
    Verdict.ENVIRONMENT,
    Verdict.UNSUPPORTED,
    Verdict.PASS,
    Verdict.SKIP,
)
BUILD_MODE = "build"
REASON_MAX = 200
#: A cell's own link on the dashboard is ``index.html#cell=<cell id>``: stable (the id is), and
#: what PR comments and alerts point at (:func:`cell_url`).
CELL_ANCHOR = "cell="


def cell_url(dashboard_url: str, cell_id: str) -> str:
    """The link that opens one cell's evidence on the published dashboard at ``dashboard_url``."""
    base = dashboard_url.split("#", 1)[0]
    return f"{base}#{CELL_ANCHOR}{quote(cell_id, safe='')}"


def bucket(verdict: Verdict) -> str:
    return _BUCKET_OF[verdict]


def one_line_reason(result: CellResult, limit: int = REASON_MAX) -> str:
    """Why a cell is not ``pass``, in one line: its reason, else its worst check's summary."""
    text = result.reason
    if not text:
        for verdict in SEVERITY:
            check = next((c for c in result.checks if c.status is verdict and c.summary), None)
            if check is not None and verdict is not Verdict.PASS:
                text = f"{check.name}: {check.summary}"
                break
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def worst(entries: Iterable[Entry]) -> Entry:
    """The entry a slot shows when several environments report the same cell."""
    return min(entries, key=lambda e: SEVERITY.index(e.result.verdict))


@dataclass
class Column:
    """One release-table column and the evidence behind it."""

    name: str
    gpus: set[str] = field(default_factory=set)  # devices that ran runtime cells of this arch
    binary: bool = False  # a build cell produced a verdict
    cpu: bool = False
    broken_modes: set[str] = field(default_factory=set)  # modes the environment broke (verdict environment)

    @property
    def label(self) -> str:
        return self._evidence_label() + self._note()

    def _evidence_label(self) -> str:
        if self.cpu:
            return self.name
        if self.gpus:
            return f"{self.name} ({', '.join(sorted(self.gpus))})"
        if self.binary:
            return f"{self.name} (binary only)"
        return f"{self.name} (not run)"

    def _note(self) -> str:
        """The environment column note: modes broken here for the ops' own references too."""
        if not self.broken_modes:
            return ""
        return f" {ICONS['environment']} {', '.join(sorted(self.broken_modes))} broken here"


def columns(entries: Iterable[Entry], environments: Mapping[str, Mapping[str, Any]]) -> dict[str, Column]:
    """Columns in display order, each knowing whether a GPU ran it or only its binary was checked."""
    found: dict[str, Column] = {}
    for entry in entries:
        cell = entry.result.cell
        column = found.setdefault(column_of(cell), Column(column_of(cell), cpu=cell.arch == "cpu"))
        if not entry.result.verdict.ran:
            continue
        if entry.result.verdict is Verdict.ENVIRONMENT:
            column.broken_modes.add(cell.mode)
        if cell.mode == BUILD_MODE:
            column.binary = True
            continue
        fingerprint = Fingerprint.from_json(environments.get(entry.env_key, {}))
        if cell.arch != "cpu" and fingerprint.arch == cell.arch:
            column.gpus.add(fingerprint.short_gpu or cell.arch)
    return {name: found[name] for name in sorted(found, key=column_sort_key)}


@dataclass(frozen=True)
class EnvironmentNote:
    """One mode the environment broke in one column: how many op cells, and what their controls said."""

    column: str
    mode: str
    cells: int
    controls: tuple[str, ...]
    reason: str


def environment_notes(entries: Iterable[Entry]) -> list[EnvironmentNote]:
    """Per (column, mode), the op cells given ``environment`` and the controls that explain them."""
    groups: dict[tuple[str, str], list[CellResult]] = {}
    for entry in entries:
        if entry.result.verdict is Verdict.ENVIRONMENT:
            groups.setdefault((column_of(entry.result.cell), entry.result.cell.mode), []).append(entry.result)
    notes = []
    for column, mode in sorted(groups, key=lambda key: (column_sort_key(key[0]), key[1])):
        results = groups[(column, mode)]
        linked = [c.details for r in results if (c := r.check("control")) is not None]
        controls = tuple(sorted({str(d.get("control", "")) for d in linked if d.get("control")}))
        reasons = [str(d.get("reason") or d.get("verdict") or "") for d in linked]
        reason = max(set(reasons), key=reasons.count) if reasons else ""
        notes.append(EnvironmentNote(column, mode, len(results), controls, reason))
    return notes


def row_of(result: CellResult) -> str:
    return f"{result.cell.op}/{result.cell.impl}"


def resolved(entries: Iterable[Entry]) -> dict[str, Entry]:
    """One entry per cell id (worst across environments), for counting."""
    groups: dict[str, list[Entry]] = {}
    for entry in entries:
        groups.setdefault(entry.result.id, []).append(entry)
    return {cell_id: worst(group) for cell_id, group in sorted(groups.items())}


def counts(entries: Iterable[Entry]) -> Counter[str]:
    return Counter(bucket(e.result.verdict) for e in entries)


def format_counts(
    counter: Counter[str], sep: str = " · ", compact: bool = False, icons: Mapping[str, str] = ICONS
) -> str:
    """ "✅ 42 · ⚠️ 2 · ❌ 1 · – 3" (+ "🚫 n" / "🌐 n" only where such cells exist).

    ``compact`` drops zero counts (per-op tables, where most slots hold one bucket).
    """
    if not counter:
        return ""
    shown = [b for b in BUCKETS if counter[b] or (not compact and b not in OPTIONAL_BUCKETS)]
    return sep.join(f"{icons[b]} {counter[b]}" for b in shown)


def terminal_summary(entries: Iterable[Entry], environments: Mapping[str, Mapping[str, Any]]) -> str:
    """Counts per verdict per environment, as a plain-text table for the CI log."""
    by_env: dict[str, Counter[str]] = {}
    for entry in entries:
        by_env.setdefault(entry.env_key, Counter())[entry.result.verdict.value] += 1
    verdicts = [v.value for v in Verdict]
    width = max([len("environment"), *(len(k) for k in by_env)])
    lines = ["  ".join([f"{'environment':<{width}}", *(f"{v:>11}" for v in verdicts), f"{'total':>7}"])]
    total: Counter[str] = Counter()
    for key in sorted(by_env):
        counter = by_env[key]
        total.update(counter)
        row = [f"{key:<{width}}", *(f"{counter[v]:>11}" for v in verdicts), f"{sum(counter.values()):>7}"]
        lines.append("  ".join(row))
        fingerprint = Fingerprint.from_json(environments.get(key, {}))
        if fingerprint.gpu_name:
            lines.append(f"  ({fingerprint.gpu_name}, {fingerprint.arch})")
    row = [f"{'all':<{width}}", *(f"{total[v]:>11}" for v in verdicts), f"{sum(total.values()):>7}"]
    lines.append("  ".join(row))
    return "\n".join(lines)
