"""Idempotent alerts: a JSON state file of what each platform already received.

Key: platform + run id + cell (with device, and shape for perf) + kind of
regression.  Re-running the alert step of the same workflow run (a re-run of
a failed job, a retried step) posts nothing new; a later run with the same
regression posts again, because its run id differs.  Keys hold no secrets,
only ids, so the state file can be an uploaded artifact or a cache entry.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opgate.matrix.errors import ResultsFormatError
from opgate.reports.alerts.message import AlertItem

STATE_VERSION = 1


@dataclass
class DedupState:
    path: Path | None
    sent: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path | None) -> DedupState:
        if path is None or not path.exists():
            return cls(path)
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ResultsFormatError(f"{path}: alert state is not readable JSON: {exc}") from exc
        if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
            raise ResultsFormatError(f"{path}: alert state version {data!r:.40} is not {STATE_VERSION}")
        return cls(path, dict(data.get("sent") or {}))

    @staticmethod
    def key(platform: str, item: AlertItem) -> str:
        return f"{platform}|{item.dedup_key}"

    def pending(self, platform: str, items: Iterable[AlertItem]) -> list[AlertItem]:
        return [i for i in items if self.key(platform, i) not in self.sent]

    def mark(self, platform: str, items: Iterable[AlertItem], when: str) -> None:
        for item in items:
            self.sent[self.key(platform, item)] = {"at": when, "kind": item.kind, "cell": item.cell}

    def save(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps({"version": STATE_VERSION, "sent": self.sent}, indent=1) + "\n")
        tmp.replace(self.path)
