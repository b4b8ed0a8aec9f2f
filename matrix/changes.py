"""``--changed-since REF``: only the cells a git diff can affect.

A pull request that touches one kernel should not pay for the whole matrix.
The diff is taken from the merge base of ``REF`` and ``HEAD`` to the working
tree (committed, staged, unstaged and untracked files alike), so on a PR's
merge commit it is the PR's own change, and on a branch it ignores what the
base branch did meanwhile.  A changed file affects:

* every op whose sources cover it (:func:`opgate.matrix.sources.op_closure`:
  its spec, the Python its references import, followed through imports, its
  CUDA sources), including an op that imports a module the diff deleted;
* every cell, when it is harness code (the validators and matrix stages and
  the opgate modules they import) or the matrix config in use: those can
  change any verdict, and the output says so;
* nothing otherwise (docs, reports, tests that are not op specs).

The verdict cache still judges each selected cell on its own; this filter is
what lets a plan launch no GPU shard at all for a change that cannot matter.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opgate.matrix.errors import ConfigError, UsageError
from opgate.matrix.sources import harness_closure, op_closure

if TYPE_CHECKING:
    from opgate.matrix.cell import Cell

GIT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Changes:
    """The files that differ between the merge base of ``ref`` and the working tree."""

    ref: str
    base: str  # the merge-base commit
    top: Path  # the checkout's top folder
    paths: frozenset[Path]  # resolved; deleted files included


def _git(args: Sequence[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    git = shutil.which("git")
    if git is None:
        raise ConfigError("--changed-since needs git, and there is no git on PATH")
    try:
        return subprocess.run(
            [git, *args], cwd=cwd, capture_output=True, text=True, timeout=GIT_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"--changed-since: git {' '.join(args)} failed: {exc}") from exc


def _first_line(proc: subprocess.CompletedProcess[str]) -> str:
    return (proc.stderr.strip().splitlines() or ["no output"])[0]


def changed_files(ref: str, cwd: Path | None = None) -> Changes:
    """Files changed since ``ref`` in the git checkout holding ``cwd`` (default: the current folder).

    Not a checkout is a config error (exit 3); ``ref`` not naming a commit is a
    usage error (exit 2), with the fetch hint a shallow CI clone needs.
    """
    where = Path(cwd or Path.cwd()).resolve()
    top = _git(["rev-parse", "--show-toplevel"], where)
    if top.returncode != 0:
        raise ConfigError(f"--changed-since {ref}: {where} is not in a git checkout ({_first_line(top)})")
    root = Path(top.stdout.strip()).resolve()
    commit = _git(["rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}"], root)
    if commit.returncode != 0 or not commit.stdout.strip():
        raise UsageError(
            f"--changed-since {ref}: not a commit in {root} "
            "(a shallow clone may lack it: fetch it, e.g. actions/checkout with fetch-depth: 0)"
        )
    base = _git(["merge-base", commit.stdout.strip(), "HEAD"], root)
    if base.returncode != 0 or not base.stdout.strip():
        raise UsageError(f"--changed-since {ref}: no merge base with HEAD in {root} ({_first_line(base)})")
    sha = base.stdout.strip()
    diff = _git(["diff", "--name-only", "--no-renames", "-z", sha, "--"], root)
    untracked = _git(["ls-files", "--others", "--exclude-standard", "-z"], root)
    for proc in (diff, untracked):
        if proc.returncode != 0:
            raise ConfigError(f"--changed-since {ref}: git failed in {root}: {_first_line(proc)}")
    names = [n for n in (diff.stdout + untracked.stdout).split("\0") if n]
    return Changes(ref, sha, root, frozenset((root / n).resolve() for n in names))


@dataclass
class Affected:
    """Which ops a change can affect, and why; ``everything`` when harness code or the config changed."""

    changes: Changes
    everything: list[Path] = field(default_factory=list)  # the harness/config files that changed
    ops: dict[str, list[Path]] = field(default_factory=dict)  # op -> the changed files it depends on

    def describe(self) -> str:
        """One line for the run's output: what the diff touched and what therefore runs."""
        n = len(self.changes.paths)
        since = f"--changed-since {self.changes.ref} ({self.changes.base[:10]}): {n} file(s) changed"
        if self.everything:
            changed = _names(self, self.everything)
            return f"{since}; every cell runs: harness code or matrix config changed ({changed})"
        if not self.ops:
            return f"{since}; none can change a verdict (no op, validator or matrix file)"
        ops = ", ".join(f"{op} ({_names(self, files, 2)})" for op, files in sorted(self.ops.items()))
        return f"{since}; ops affected: {ops}"

    def keep(self, cells: Sequence[Cell]) -> list[Cell]:
        return list(cells) if self.everything else [c for c in cells if c.op in self.ops]


def _names(affected: Affected, files: Sequence[Path], limit: int = 3) -> str:
    def rel(p: Path) -> str:
        return str(p.relative_to(affected.changes.top)) if p.is_relative_to(affected.changes.top) else str(p)

    shown = ", ".join(rel(p) for p in sorted(files)[:limit])
    return shown + (f" and {len(files) - limit} more" if len(files) > limit else "")


def affected_by(changes: Changes, specs: Mapping[str, Any], config_path: Path | None) -> Affected:
    """Map changed files to ops (through each op's sources) or to everything (harness, config)."""
    from opgate.matrix.config import DEFAULT_CONFIG

    found = Affected(changes)
    harness = harness_closure()
    config = Path(config_path or DEFAULT_CONFIG).resolve()
    found.everything = sorted(p for p in changes.paths if p == config or harness.covers(p))
    if found.everything:
        return found
    for name, spec in specs.items():
        closure = op_closure(spec)
        touched = sorted(p for p in changes.paths if closure.covers(p))
        if touched:
            found.ops[name] = touched
    return found


def narrow_to_changes(
    cells: Sequence[Cell], specs: Mapping[str, Any], config_path: Path | None, ref: str
) -> tuple[list[Cell], Affected]:
    """The cells ``--changed-since ref`` keeps (possibly none: a change that cannot matter)."""
    affected = affected_by(changed_files(ref), specs, config_path)
    return affected.keep(cells), affected
