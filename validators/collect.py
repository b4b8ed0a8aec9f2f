"""Assemble ``results.json`` and ``junit.xml`` from the per-cell records of a run.

Workers write ``DIR/cells/<id>.json`` as each cell finishes, so a run that is
cut short (a cancelled CI job, a shard at its time limit, Ctrl-C) still holds
every finished verdict.  ``collect`` turns those records into the same files a
complete run writes, marked ``interrupted`` in ``argv`` metadata, so reports
can publish what finished rather than nothing.  It never invents a verdict:
cells that did not finish are simply absent (``untested`` in the compat table).
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from opgate.matrix.errors import ResultsFormatError
from opgate.validators.junit import write_junit
from opgate.validators.result import CellResult, RunResults


def _read(path: Path) -> CellResult:
    try:
        return CellResult.from_json(json.loads(path.read_text()))
    except (OSError, json.JSONDecodeError) as exc:
        raise ResultsFormatError(f"{path}: unreadable cell record: {exc}") from exc


def write_run(run: RunResults, out: Path) -> dict[str, Any]:
    """Write a run's ``results.json`` and ``junit.xml`` (complete or collected); return the results."""
    doc = run.write(out / "results.json")
    write_junit(run, out / "junit.xml")
    return doc


def collect(out: Path, argv: list[str] | None = None, note: str = "interrupted") -> RunResults:
    """Read ``out/cells/*.json`` and write ``out/results.json`` and ``out/junit.xml``."""
    cells_dir = out / "cells"
    records = [_read(path) for path in sorted(cells_dir.glob("*.json"))]
    if not records:
        raise ResultsFormatError(f"{cells_dir}: no finished cell records to collect")
    env = next((r.env for r in records if r.env), {})
    stamp = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    run = RunResults(
        cells=sorted(records, key=lambda r: r.id),
        env=env,
        started_at=stamp,
        finished_at=stamp,
        argv=[*(argv or []), f"# collected from cells/ ({note})"],
    )
    write_run(run, out)
    return run
