"""Platform-neutral alert content built from a JSON diff, and fitting it into limits.

Every chat platform caps message size differently (Discord 2000 characters,
WeCom 4096 bytes, Feishu 20 KB, ...).  Each platform module builds its payload
from the first ``k`` lines plus a "… and N more: full report" pointer, and
:func:`fit` finds the largest ``k`` whose *serialised* payload the platform
accepts, so a limit is never guessed from a character count of one field.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from opgate.reports.view import cell_url

KINDS = {"new_failures": "new_failure", "new_fallbacks": "new_fallback"}
ICON = {"new_failure": "❌", "new_fallback": "⚠️", "perf_regression": "📉"}
LABEL = {"new_failure": "new failure", "new_fallback": "new fallback", "perf_regression": "perf regression"}


@dataclass(frozen=True)
class AlertItem:
    """One regression; ``dedup_key`` = run id + cell (+ device, shape) + kind."""

    kind: str
    cell: str
    device: str
    text: str
    dedup_key: str
    url: str = ""  # the cell's evidence on the published dashboard, when its URL is known

    def to_json(self) -> dict[str, str]:
        out = {"kind": self.kind, "cell": self.cell, "device": self.device, "text": self.text}
        return {**out, "url": self.url} if self.url else out


@dataclass
class Alert:
    run_id: str
    report_url: str
    items: list[AlertItem]
    summary: dict[str, int] = field(default_factory=dict)
    head: str = ""

    @property
    def title(self) -> str:
        parts = []
        for kind in ("new_failure", "new_fallback", "perf_regression"):
            n = sum(1 for i in self.items if i.kind == kind)
            if n:
                parts.append(f"{n} {LABEL[kind]}{'s' if n > 1 else ''}")
        return f"opgate: {', '.join(parts) or 'no regressions'} (run {self.run_id})"

    @property
    def idempotency_key(self) -> str:
        """Same items (run id included), same key: what a receiver drops a repeat by."""
        keys = "\n".join(sorted(item.dedup_key for item in self.items))
        return hashlib.sha256(keys.encode()).hexdigest()[:32]

    def lines(self) -> list[str]:
        return [item.text for item in self.items]

    def more_line(self, omitted: int) -> str:
        where = f": {self.report_url}" if self.report_url else " (see the full diff)"
        return f"… and {omitted} more{where}"

    def body(self, k: int) -> list[str]:
        """The first ``k`` item lines, plus the pointer line when some were left out."""
        lines = self.lines()
        kept = lines[:k]
        if k < len(lines):
            kept.append(self.more_line(len(lines) - k))
        return kept


def _one_line(text: str, limit: int = 240) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def from_diff(doc: Mapping[str, Any], run_id: str, report_url: str, dashboard_url: str = "") -> Alert:
    """Alert items for every regression in a diff (fixes and lost coverage are only counted).

    With ``dashboard_url`` (the published index.html) each line ends with its cell's link.
    """

    def link(cell: str) -> str:
        return cell_url(dashboard_url, cell) if dashboard_url else ""

    items = []
    for category, kind in KINDS.items():
        for change in doc.get(category) or []:
            reason = _one_line(change.get("reason") or "")
            text = (
                f"{ICON[kind]} {LABEL[kind]}: `{change['cell']}` on {change['device']} "
                f"({change['base'] or 'new'} → {change['head']}){': ' + reason if reason else ''}"
            )
            key = f"{run_id}|{change['cell']}@{change['device']}|{kind}"
            url = link(change["cell"])
            items.append(
                AlertItem(kind, change["cell"], change["device"], f"{text} {url}".rstrip(), key, url)
            )
    for perf in doc.get("perf_regressions") or []:
        kind = "perf_regression"
        text = (
            f"{ICON[kind]} {LABEL[kind]}: `{perf['cell']}` {perf['shape']} on {perf['gpu']}: "
            f"{perf['change'] * 100:+.1f}% ({perf['base_median_us']:.1f} → {perf['head_median_us']:.1f} us, "
            f"p={perf['p_value']:.1e})"
        )
        key = f"{run_id}|{perf['cell']}@{perf['gpu']}#{perf['shape']}|{kind}"
        url = link(perf["cell"])
        items.append(AlertItem(kind, perf["cell"], perf["gpu"], f"{text} {url}".rstrip(), key, url))
    return Alert(run_id, report_url, items, dict(doc.get("summary") or {}), str(doc["head"]["path"]))


def fit(build: Callable[[int], Any], n: int, ok: Callable[[Any], bool]) -> Any:
    """The payload ``build(k)`` for the largest ``k <= n`` that ``ok`` accepts (binary search).

    ``build(0)`` (headline and pointer only) is returned even if ``ok`` rejects
    it: a truncated alert beats none, and the platform's answer is reported.
    """
    if ok(full := build(n)):
        return full
    lo, hi = 0, n - 1
    best = build(0)
    while lo <= hi:
        mid = (lo + hi) // 2
        candidate = build(mid)
        if ok(candidate):
            best, lo = candidate, mid + 1
        else:
            hi = mid - 1
    return best


def json_size(payload: Any) -> int:
    """Bytes of the body as the transport sends it."""
    return len(json.dumps(payload, ensure_ascii=False).encode())
