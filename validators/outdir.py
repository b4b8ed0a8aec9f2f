"""A run's output folder: writing its records, and clearing the previous run's out of the way.

What a run writes there is listed in :mod:`validators.runner`; these are the
two operations every writer shares: a JSON file written atomically, and a
folder emptied of the last run's records before this run's first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from opgate.matrix.files import write_output
from opgate.validators.collect import PLANNED_FILE

#: A previous run's per-cell folders, moved aside at the start and deleted in the background.
OLD_OUTPUTS = ".opgate-old-"
#: The folders of per-cell records (and their logs) a run writes.
RECORD_FOLDERS = ("cells", "controls", "logs")


def write_json(path: Path, data: Any, indent: int | None = 1) -> None:
    """Atomically; per-cell records without indent (the C encoder: a run writes one per cell)."""
    write_output(path, json.dumps(data, indent=indent) + "\n", atomic=True)


def clear_outputs(out: Path) -> None:
    """Take a previous run's files in ``out`` out of the way (only files and folders opgate writes).

    ``results.json`` goes too: a run killed before it writes its own must not
    leave the previous run's, which would publish as this one.  The per-cell
    folders are renamed at once and removed by a detached process while this
    run goes on: deleting thousands of small files one by one costs seconds on
    a slow disk (one left behind by a killed run goes with the next).
    """
    for name in ("results.json", "junit.xml", "run.json", PLANNED_FILE):  # first: nothing to publish
        (out / name).unlink(missing_ok=True)
    stale = sorted(out.glob(f"{OLD_OUTPUTS}*"))
    for name in RECORD_FOLDERS:
        if (out / name).is_dir():
            moved = out / f"{OLD_OUTPUTS}{name}-{os.getpid()}-{time.time_ns()}"
            (out / name).rename(moved)
            stale.append(moved)
    if stale:
        code = "import shutil, sys\nfor p in sys.argv[1:]: shutil.rmtree(p, ignore_errors=True)"
        subprocess.Popen(
            [sys.executable, "-c", code, *map(str, stale)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
