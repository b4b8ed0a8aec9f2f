"""compat.json: the published matrix, the one file every later tool reads.

Diffs, alerts, the dashboard and the next publish's history all start from a
compat.json, possibly one published weeks ago by an older opgate.  So the file
is versioned (``schema_version``) and checked against a published JSON Schema
(``reports/schema/compat.schema.json``, whose ``$id`` carries the version) both
when written and when read: a bad file fails loudly with the JSON path of the
problem instead of rendering a wrong table.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema

from opgate.matrix.errors import ResultsFormatError, UsageError
from opgate.matrix.files import read_json
from opgate.matrix.modes import to_json as modes_json
from opgate.reports.merge import Entry, Merged
from opgate.reports.perf import (
    HISTORY_LIMIT,
    SAMPLES_KEPT,
    refuse_bad_perf,
    series_from_results,
    with_history,
)
from opgate.validators.env import Fingerprint, FingerprintError
from opgate.validators.result import CellResult, compact_record, dumps_one_record_per_line

COMPAT_SCHEMA_VERSION = 1
SCHEMA_DIR = Path(__file__).parent / "schema"
COMPAT_SCHEMA_FILE = SCHEMA_DIR / "compat.schema.json"


@cache
def load_schema(path: Path = COMPAT_SCHEMA_FILE) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def validate_document(doc: Mapping[str, Any], where: str, schema_file: Path = COMPAT_SCHEMA_FILE) -> None:
    """Raise :class:`ResultsFormatError` naming the JSON path of the first schema violation."""
    schema = load_schema(schema_file)
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
    if errors:
        first = errors[0]
        location = "/".join(str(p) for p in first.absolute_path) or "(top level)"
        more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
        raise ResultsFormatError(
            f"{where}: not a valid opgate document ({schema['$id']}): at {location}: {first.message}{more}"
        )


#: The latest instant ``SOURCE_DATE_EPOCH`` may name (9999-12-31T23:59:59Z: a timestamp has 4 digits of year).
MAX_EPOCH = 253402300799


def now_utc() -> str:
    """Publication time; honours SOURCE_DATE_EPOCH so rebuilt reports are byte-identical.

    A value that is not a whole number of seconds from 1970 to 9999 is a usage
    error (exit 2) naming the variable, never a traceback, and is found before
    anything is written or sent.
    """
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    if not epoch:
        return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    try:
        seconds = int(epoch)
    except ValueError:
        seconds = -1
    if not 0 <= seconds <= MAX_EPOCH:
        raise UsageError(
            f"SOURCE_DATE_EPOCH={epoch!r}: not a Unix time (whole seconds since 1970, at most {MAX_EPOCH})"
        )
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Compat:
    """A compat document, parsed: the rows reports render, plus the raw JSON."""

    generated_at: str
    environments: dict[str, dict[str, Any]]
    entries: list[Entry]
    perf: dict[str, Any] = field(default_factory=dict)
    sources: list[dict[str, Any]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # planned cells without a verdict: incomplete
    #: environment controls (validators.controls): they explain ``environment`` cells, never counted as cells
    controls: list[Entry] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": COMPAT_SCHEMA_VERSION,
            "schema": load_schema()["$id"],
            "generated_at": self.generated_at,
            "sources": self.sources,
            "missing": self.missing,
            "environments": self.environments,
            "modes": modes_json(),
            "cells": self._records(self.entries),
            "controls": self._records(self.controls),
            "perf": self.perf,
        }

    def _records(self, entries: list[Entry]) -> list[dict[str, Any]]:
        """The compact record: evidence of red checks, no env (``environments[env_key]`` holds it)."""
        return [
            {**compact_record(e.result.to_json(), self.environments.get(e.env_key)), "env_key": e.env_key}
            for e in entries
        ]


def build(merged: Merged, history: Compat | None = None, generated_at: str | None = None) -> Compat:
    """The compat document for a merge, with perf history carried over from ``history``."""
    when = generated_at or now_utc()
    # a point of history is labelled with when its run finished, not when it was published
    finished = {src.path: src.finished_at for src in merged.sources}
    new_series = [
        series
        for e in merged.entries
        for series in series_from_results(
            [(e.result, e.env_key, merged.environments.get(e.env_key, {}))], finished.get(e.source) or when
        )
    ]
    old_series = (history.perf.get("series") or []) if history else []
    series = with_history(new_series, old_series)
    perf = {"history_limit": HISTORY_LIMIT, "samples_kept": SAMPLES_KEPT, "series": series}
    environments = dict(history.environments) if history else {}
    # Only environments that still have cells or perf series stay in the document.
    used = {e.env_key for e in (*merged.entries, *merged.controls)} | {str(s["env_key"]) for s in series}
    environments = {k: v for k, v in environments.items() if k in used}
    environments.update(merged.environments)
    return Compat(
        generated_at=when,
        environments=dict(sorted(environments.items())),
        entries=list(merged.entries),
        perf=perf,
        sources=[asdict(s) for s in merged.sources],
        missing=list(merged.missing),
        controls=list(merged.controls),
    )


def _check_environments(environments: Mapping[str, Any], where: str) -> None:
    """Each environment must be the fingerprint record the validators write."""
    bad = {}
    for key, record in environments.items():
        try:
            Fingerprint.from_json(record)
        except FingerprintError as exc:  # noqa: PERF203 - one message per bad environment
            bad[key] = str(exc)
    if bad:
        key, why = next(iter(bad.items()))
        raise ResultsFormatError(f"{where}: environments/{key}: {why}")


def from_document(doc: Mapping[str, Any], where: str) -> Compat:
    """Parse a compat document after validating it against the schema."""
    validate_document(doc, where)
    _check_environments(doc["environments"], where)
    environments = doc["environments"]

    def entry(record: Mapping[str, Any]) -> Entry:
        result = CellResult.from_json({"env": environments.get(record["env_key"], {}), **record})
        return Entry(result, str(record["env_key"]), where)

    entries = [entry(r) for r in doc["cells"]]
    controls = [entry(r) for r in doc.get("controls") or []]
    refuse_bad_perf((e.result for e in entries), where)
    return Compat(
        generated_at=str(doc["generated_at"]),
        environments={k: dict(v) for k, v in doc["environments"].items()},
        entries=entries,
        perf=dict(doc.get("perf") or {}),
        sources=list(doc.get("sources") or []),
        missing=[str(m) for m in doc.get("missing") or []],
        controls=controls,
    )


def load(path: Path) -> Compat:
    """Read and validate ``compat.json``."""
    doc = read_json(path, what="compat file", expect=dict)
    version = doc.get("schema_version")
    if version != COMPAT_SCHEMA_VERSION:
        raise ResultsFormatError(
            f"{path}: compat schema_version {version!r}, this opgate reads {COMPAT_SCHEMA_VERSION}"
        )
    return from_document(doc, str(path))


def dumps(compat: Compat) -> str:
    """Validated JSON text of a compat document (validation on write, not only on read).

    One cell record per line: a republish that changes a few verdicts changes a few lines.
    """
    doc = compat.to_json()
    validate_document(doc, "compat.json (being written)")
    return dumps_one_record_per_line(doc, "cells") + "\n"
