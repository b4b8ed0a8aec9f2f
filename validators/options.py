"""What one ``opgate run`` is asked to do, and the command line that re-runs one of its cells.

Kept apart from the runner (:mod:`validators.runner`) so the CLI, the tests and
a repro line can name a run's options without the machinery that runs it.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

#: Values that turn an ``OPGATE_*`` switch off (a cache, a lock, compiling ahead), in any case.
OFF_VALUES = frozenset({"0", "false", "no", "off"})
REPRO_OUT = "/tmp/opgate-repro"  # noqa: S108 - a suggestion printed for humans, never written by opgate


@dataclass
class RunOptions:
    out: Path
    config: Path | None = None
    select: Sequence[str] = ()
    skip: Sequence[str] = ()
    ops_paths: Sequence[Path] = ()
    jobs: int | None = None
    gpu_workers: int = 1  # workers sharing each GPU (cells are mostly host-bound compile work)
    timeout_s: float | None = None  # overrides every cell's timeout for this run
    memory_mb: int | None = None  # overrides every cell's worker memory limit for this run
    retries: int = 1
    seed: int | None = None
    progress: bool = True
    use_cache: bool = True  # serve unchanged cells' verdicts from the cache (--no-cache: re-run all)
    cache_dir: Path | None = None
    changed_since: str | None = None  # git ref: only the cells a diff since it can affect
    keep_warm_min: float | None = None  # keep the fork servers warm for later runs (validators.warmserver)
    argv: Sequence[str] = ()


def switched_off(env: Mapping[str, str], name: str) -> bool:
    """Whether ``env`` turns the switch ``name`` off (``0``, ``false``, ``no``, ``off``)."""
    return env.get(name, "").strip().lower() in OFF_VALUES


def repro_command(cell_id: str, seed: int | None, options: RunOptions) -> str:
    """One line that re-runs just this cell with the same inputs (seed) and op folders."""
    quoted = f"'{cell_id}'" if shlex.quote(cell_id) == cell_id else shlex.quote(cell_id)
    parts = ["opgate run", f"--select {quoted}"]
    if seed is not None:
        parts.append(f"--seed {seed}")
    if options.config is not None:
        parts.append(f"--config {shlex.quote(str(Path(options.config).resolve()))}")
    parts += [f"--ops-path {shlex.quote(str(Path(p).resolve()))}" for p in options.ops_paths]
    parts.append(f"--out {REPRO_OUT}")
    return " ".join(parts)
