"""Merge results from many runs or shards into one set of (cell, environment) verdicts.

Shards of one workflow run land on different machines and come back as
separate ``results.json`` files.  Merging is where silent data loss would
happen, so it refuses rather than guesses:

* the same cell in the same environment with two different verdicts is a
  :class:`~matrix.errors.MergeConflict` (naming the cell, both verdicts and
  both files) — one of the two runs is wrong and a person must say which;
* identical duplicates (a shard downloaded twice) are dropped;
* environment controls (``controls`` of each run) are merged beside the cells:
  one per (control, environment), the worst when shards disagree, since a
  control only explains cells and is not itself a verdict of record;
* with a plan manifest, a planned shard whose cells are absent is a
  :class:`~matrix.errors.MissingShard`: a table without those cells would read
  as "fewer cells", not "shard lost".
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opgate.matrix.errors import MergeConflict, MissingShard, ResultsFormatError
from opgate.matrix.plan import load_manifest
from opgate.reports.completeness import missing_cells
from opgate.reports.perf import refuse_bad_perf
from opgate.validators.env import Fingerprint, FingerprintError
from opgate.validators.result import CellResult, RunResults

RESULTS_FILE = "results.json"


@dataclass(frozen=True)
class Entry:
    """One verdict: a cell result, the environment it holds for, and the file it came from."""

    result: CellResult
    env_key: str
    source: str = ""

    @property
    def key(self) -> tuple[str, str]:
        return (self.result.id, self.env_key)


@dataclass
class SourceInfo:
    """Where a merged run came from (kept in compat.json for provenance)."""

    path: str
    shard: str
    started_at: str
    finished_at: str
    cells: int


@dataclass
class Merged:
    """Deduplicated verdicts plus every environment fingerprint seen."""

    entries: list[Entry] = field(default_factory=list)
    environments: dict[str, dict[str, Any]] = field(default_factory=dict)
    sources: list[SourceInfo] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # planned by a run, produced by none
    controls: list[Entry] = field(default_factory=list)


def results_path(directory: Path) -> Path:
    """``DIR/results.json``; a file path is accepted as is (handy for single files)."""
    return directory if directory.is_file() else directory / RESULTS_FILE


def read_runs(directories: Sequence[Path]) -> list[tuple[Path, RunResults]]:
    """Read every ``DIR/results.json``; a missing file is an error naming the folder."""
    runs = []
    for directory in directories:
        path = results_path(directory)
        if not path.exists():
            raise ResultsFormatError(f"{path}: no results file (did the run write to {directory}?)")
        run = RunResults.read(path)
        refuse_bad_perf(run.cells, str(path))
        runs.append((path, run))
    return runs


def _environment(path: Path, result: CellResult, run: RunResults, merged: Merged) -> str:
    """The environment key of a record (its own fingerprint, else the run's), noted in ``merged``."""
    fingerprint = result.env or run.env
    try:
        key = Fingerprint.from_json(fingerprint).key
    except FingerprintError as exc:
        raise ResultsFormatError(f"{path}: cell {result.id}: {exc}") from exc
    merged.environments.setdefault(key, dict(fingerprint))
    return key


def merge(runs: Iterable[tuple[Path, RunResults]]) -> Merged:
    """Merge runs; raise :class:`MergeConflict` on disagreeing verdicts."""
    merged = Merged()
    seen: dict[tuple[str, str], Entry] = {}
    runs = list(runs)
    merged.missing = missing_cells(run for _, run in runs)
    controls: dict[tuple[str, str], Entry] = {}
    for path, run in runs:
        merged.sources.append(
            SourceInfo(str(path), run.shard, run.started_at, run.finished_at, len(run.cells))
        )
        for result in run.cells:
            key = _environment(path, result, run, merged)
            entry = Entry(result, key, str(path))
            previous = seen.get(entry.key)
            if previous is None:
                seen[entry.key] = entry
                merged.entries.append(entry)
            elif previous.result.verdict is not result.verdict:
                raise MergeConflict(
                    f"cell {result.id} in environment {key} has two verdicts: "
                    f"{previous.result.verdict.value} in {previous.source} and "
                    f"{result.verdict.value} in {path}; re-run that cell or drop one of the files"
                )
        for result in run.controls:
            entry = Entry(result, _environment(path, result, run, merged), str(path))
            kept = controls.get(entry.key)
            if kept is None or (result.verdict.is_bad and not kept.result.verdict.is_bad):
                controls[entry.key] = entry
    merged.entries.sort(key=lambda e: e.key)
    merged.controls = sorted(controls.values(), key=lambda e: e.key)
    return merged


def check_manifest(merged: Merged, manifest_path: Path) -> None:
    """Raise :class:`MissingShard` unless every planned cell has at least one result.

    Checked by cell id, not by shard name: a shard that wrote half its results
    loses cells just as surely as one that never ran.
    """
    manifest = load_manifest(manifest_path)
    present = {e.result.id for e in merged.entries}
    problems = []
    for name in manifest.incomplete_shards(present):
        planned = manifest.shards[name]
        missing = [c for c in planned if c not in present]
        state = "did not report" if len(missing) == len(planned) else "is incomplete"
        problems.append(
            f"shard {name} {state}: {len(missing)} of {len(planned)} planned cells "
            f"missing (first: {missing[0]})"
        )
    if problems:
        raise MissingShard(
            f"{manifest_path}: refusing to publish; " + "; ".join(problems) + " (re-run the missing shard)"
        )
