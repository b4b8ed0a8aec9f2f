"""Assemble ``results.json`` and ``junit.xml`` from the per-cell records of a run.

Workers write ``DIR/cells/<id>.json`` as each cell finishes, so a run that is
cut short (a cancelled CI job, a shard at its time limit, Ctrl-C) still holds
every finished verdict.  ``collect`` turns those records into the same files a
complete run writes, marked ``interrupted`` in ``argv`` metadata, so reports
can publish what finished rather than nothing.  It never invents a verdict:
cells that did not finish are absent, and listed as ``missing`` from the
run's plan (``planned.json``, written before the first cell starts), so every
report built from them says the run is incomplete and ``publish --strict``
refuses it.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from opgate.matrix.errors import ResultsFormatError
from opgate.matrix.files import MAX_JSON_BYTES, expect_type, parse_json, read_json, read_text, write_output
from opgate.validators import controls
from opgate.validators.junit import write_junit
from opgate.validators.result import CellResult, RunResults

PLANNED_FILE = "planned.json"
#: The records of the cells a run skipped at plan time, one per line (written once: at the run's
#: end, or when it is interrupted).
SKIPPED_FILE = "skipped.jsonl"


def _read(path: Path) -> CellResult:
    record = read_json(path, what="cell record", expect=dict)
    try:
        return CellResult.from_json(record)
    except ResultsFormatError as exc:
        raise ResultsFormatError(f"{path}: {exc}") from None


def write_planned(out: Path, cell_ids: list[str]) -> None:
    """Record, before any cell runs, which cells this run will produce (``collect`` reads it)."""
    write_output(out / PLANNED_FILE, json.dumps({"planned": cell_ids}, indent=0) + "\n", atomic=True)


def read_planned(out: Path) -> list[str] | None:
    """The planned cell ids of the run in ``out``, or None for a folder without a plan."""
    path = out / PLANNED_FILE
    if not path.exists():
        return None
    planned = read_json(path, what="run plan", expect=dict).get("planned")
    expect_type(planned, list, str(path), "'planned'", ResultsFormatError)
    return [str(c) for c in planned]


def _read_lines(path: Path) -> list[CellResult]:
    """The records of ``skipped.jsonl``, one per line, each read as :func:`_read` reads a file."""
    text = read_text(path, what="skipped cell records", limit=MAX_JSON_BYTES, error=ResultsFormatError)
    records = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        record = parse_json(line, f"{path}:{n}", what="skipped cell record", error=ResultsFormatError)
        expect_type(record, dict, f"{path}:{n}", "a cell record", ResultsFormatError)
        try:
            records.append(CellResult.from_json(record))
        except ResultsFormatError as exc:
            raise ResultsFormatError(f"{path}:{n}: {exc}") from None
    return records


def write_run(
    run: RunResults, out: Path, encoded: Mapping[str, tuple[CellResult, str]] | None = None
) -> dict[str, Any]:
    """Write a run's ``results.json`` and ``junit.xml`` (complete or collected); return the results.

    ``encoded``: the cells' records as the run encoded them when it stored them (``RunResults.write``).
    """
    doc = run.write(out / "results.json", encoded=encoded)
    write_junit(run, out / "junit.xml")
    return doc


def collect(out: Path, argv: list[str] | None = None, note: str = "interrupted") -> RunResults:
    """Read ``out/cells/*.json`` (and ``skipped.jsonl``) and ``out/controls/*.json``; write ``results.json``
    and ``junit.xml``.

    A cell the run had not yet compared with its control when it was cut short
    is compared now when that control finished (:func:`controls.link`, as the
    run would have at its end); one whose control did not finish keeps its own
    verdict.
    """
    cells_dir = out / "cells"
    records = [_read(path) for path in sorted(cells_dir.glob("*.json"))]
    if (cells_dir / SKIPPED_FILE).is_file():
        records += _read_lines(cells_dir / SKIPPED_FILE)
    if not records:
        raise ResultsFormatError(f"{cells_dir}: no finished cell records to collect")
    env = next((r.env for r in records if r.env), {})
    stamp = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    planned = read_planned(out)
    done = {r.id for r in records}
    finished_controls = [_read(path) for path in sorted((out / "controls").glob("*.json"))]
    by_id = {c.id: c for c in finished_controls}
    records = [controls.linked(r, by_id) for r in records]
    run = RunResults(
        cells=sorted(records, key=lambda r: r.id),
        env=env,
        started_at=stamp,
        finished_at=stamp,
        argv=[*(argv or []), f"# collected from cells/ ({note})"],
        planned=len(planned) if planned is not None else None,
        missing=sorted(c for c in planned or () if c not in done),
        controls=finished_controls,
    )
    write_run(run, out)
    return run
