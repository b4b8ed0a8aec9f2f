"""``opgate compact``: the form of a run that is kept in a repository.

A finished run folder holds far more than later readers need: every check's
full details (each comparison, graph and kernel listing of a passing cell),
the per-cell environment repeated on every record, ``junit.xml`` for the CI
job's test view, per-cell records, profiler traces and logs.  Committing that
costs megabytes per republish.  The compact form keeps what verdicts, tables,
diffs, perf history and the time breakdown read (``result.compact_record``
says exactly what) in ``results.json``, one cell per line, plus ``run.json``;
nothing else of the folder is copied.

A compaction that changed a verdict would be silent data loss, so the written
folder is read back and compared cell by cell before the command succeeds.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from opgate.matrix.errors import ResultsFormatError
from opgate.validators.result import RunResults

RESULTS_FILE = "results.json"
#: Files of a run folder kept beside the compact results: the run's own timing record.
KEPT_FILES = ("run.json",)


@dataclass(frozen=True)
class Compacted:
    """One compacted run: where it went, how many cells, bytes of results.json before and after."""

    source: Path
    dest: Path
    cells: int
    bytes_before: int
    bytes_after: int


def _verdicts(run: RunResults) -> dict[str, tuple[str, str]]:
    return {c.id: (c.verdict.value, c.reason) for c in run.cells}


def compact_run(source: Path, dest: Path, run: RunResults | None = None) -> Compacted:
    """Write the compact form of the run folder ``source`` to ``dest`` (which may be ``source``).

    ``run``: its results, read already (:func:`compact_runs` reads every source
    before it writes any).  The compact file is written beside its place, read
    back and compared cell by cell, and only then moved in: a compaction in
    place never leaves a changed verdict where the run's own file was.
    """
    results = source / RESULTS_FILE
    if not results.is_file():
        raise ResultsFormatError(f"{results}: no results file (is {source} a finished run folder?)")
    before = results.stat().st_size
    if run is None:
        run = RunResults.read(results)
    dest.mkdir(parents=True, exist_ok=True)
    staged = dest / f".{RESULTS_FILE}.compact"
    try:
        run.write(staged, compact=True)
        again = RunResults.read(staged)
        if _verdicts(again) != _verdicts(run):
            raise ResultsFormatError(
                f"{dest / RESULTS_FILE}: compact form does not read back the same verdicts"
            )
        for name in KEPT_FILES:
            if (source / name).is_file() and source.resolve() != dest.resolve():
                shutil.copyfile(source / name, dest / name)
        staged.replace(dest / RESULTS_FILE)
    finally:
        staged.unlink(missing_ok=True)
    return Compacted(source, dest, len(run.cells), before, (dest / RESULTS_FILE).stat().st_size)


def compact_runs(sources: Sequence[Path], into: Path) -> list[Compacted]:
    """Compact every run folder into ``into/<folder name>``; every source is read before any is written.

    A source that does not read (truncated, not opgate's) stops the command
    with nothing written: no earlier run in ``into`` is replaced by a
    compaction that then fails on the next source.
    """
    names = [s.name for s in sources]
    if len(set(names)) != len(names):
        raise ResultsFormatError(f"two run folders share a name, one would overwrite the other: {names}")
    for source in sources:
        if not (source / RESULTS_FILE).is_file():
            raise ResultsFormatError(f"{source / RESULTS_FILE}: no results file (not a finished run folder)")
    runs = [RunResults.read(source / RESULTS_FILE) for source in sources]
    return [compact_run(source, into / source.name, run) for source, run in zip(sources, runs, strict=True)]
