"""Progress of a long run, and the summary at the end.

On a terminal, a bar on stderr (tqdm when installed, else a one-line bar).
Without one (CI, ``| tee``, a file), one line per finished cell on stdout with
its verdict, time, the elapsed time and an ETA: a CI log shows the run moving
instead of minutes of silence, and a killed job shows where it was.  The bar
needs both streams on a terminal, so ``| tee`` never interleaves a bar with
lines.  ``--no-progress`` silences both.  The summary is the part a human
reads after a run: verdict counts, wall time, the slowest cells, and every bad
cell with its reason and the one command that re-runs it.
"""

from __future__ import annotations

import collections
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from opgate.validators.result import CellResult, RunResults, Verdict

#: Display order of verdicts in counts (worst first).
ORDER = (
    Verdict.ERROR,
    Verdict.FAIL,
    Verdict.FLAKY,
    Verdict.FALLBACK,
    Verdict.ENVIRONMENT,
    Verdict.PASS,
    Verdict.UNSUPPORTED,
    Verdict.SKIP,
)


def counts_line(counts: collections.Counter[Verdict]) -> str:
    return "  ".join(f"{v.value} {counts[v]}" for v in ORDER if counts[v])


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m // 60}:{m % 60:02d}:{s:02d}" if m >= 60 else f"{m:02d}:{s:02d}"


def _has_width(stream: TextIO) -> bool:
    try:
        return os.get_terminal_size(stream.fileno()).columns > 0
    except (OSError, ValueError, AttributeError):
        return False


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or unusual stream reads as "not a terminal"
        return False


class Progress:
    """``update`` once per finished cell; ``close`` at the end (also on interrupt)."""

    def __init__(
        self, total: int, enabled: bool = True, stream: TextIO | None = None, log: TextIO | None = None
    ) -> None:
        self.stream = stream or sys.stderr  # the bar's
        self.log = log or sys.stdout  # the per-cell lines'
        self.total = total
        self.done = 0
        self.counts: collections.Counter[Verdict] = collections.Counter()
        self.t0 = time.monotonic()
        on = enabled and total > 0
        self.lines = on and not _isatty(self.log)
        self.enabled = on and _isatty(self.stream) and not self.lines
        self._tqdm: Any = None
        if self.enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                return
            sized = _has_width(self.stream)  # a pty without a size (some CI shells) hides tqdm's bar
            self._tqdm = tqdm(
                total=total,
                file=self.stream,
                unit="cell",
                dynamic_ncols=sized,
                ncols=None if sized else 100,
                nrows=None if sized else 20,
                leave=False,
            )

    def update(self, result: CellResult) -> None:
        self.done += 1
        self.counts[result.verdict] += 1
        if self.lines:
            self._write_line(result)
        if not self.enabled:
            return
        if self._tqdm is not None:
            self._tqdm.set_postfix_str(counts_line(self.counts), refresh=False)
            self._tqdm.update(1)
            return
        self.stream.write("\r" + self.line(result.id) + "\x1b[K")
        self.stream.flush()

    def _elapsed_eta(self) -> tuple[float, float]:
        elapsed = time.monotonic() - self.t0
        return elapsed, (elapsed / self.done * (self.total - self.done) if self.done else 0.0)

    def cell_line(self, result: CellResult) -> str:
        """``[ 12/345] fail          3.1 s  <cell id>  elapsed 00:32  eta 04:10``."""
        elapsed, eta = self._elapsed_eta()
        return (
            f"[{self.done:>{len(str(self.total))}}/{self.total}] {result.verdict.value:<11} "
            f"{result.duration_s:6.1f} s  {result.id}  elapsed {_clock(elapsed)}  eta {_clock(eta)}"
        )

    def _write_line(self, result: CellResult) -> None:
        try:
            self.log.write(self.cell_line(result) + "\n")
            self.log.flush()
        except (BrokenPipeError, ValueError):  # `| head` closed it: the run goes on, silently
            self.lines = False

    def line(self, last: str = "") -> str:
        """``[=====>    ]  12/345  pass 10  fail 1  00:32 eta 04:10  <last cell>``."""
        elapsed, eta = self._elapsed_eta()
        width = 20
        filled = width * self.done // max(1, self.total)
        bar = "=" * filled + (">" if filled < width else "") + " " * max(0, width - filled - 1)
        text = (
            f"[{bar}] {self.done:>{len(str(self.total))}}/{self.total}  {counts_line(self.counts)}  "
            f"{_clock(elapsed)} eta {_clock(eta)}  {last}"
        )
        return text[: shutil.get_terminal_size((100, 20)).columns - 1]

    def close(self) -> None:
        if not self.enabled:
            return
        if self._tqdm is not None:
            self._tqdm.close()
        else:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


def format_summary(
    run: RunResults,
    wall_s: float,
    other_torch: int,
    out: Path,
    *,
    cached: int = 0,
    slowest: int = 5,
    max_bad: int = 20,
) -> str:
    """The end-of-run summary (plain text, stdout)."""
    counts = collections.Counter(c.verdict for c in run.cells)
    lines = [
        f"opgate: {len(run.cells)} cells in {wall_s:.1f} s on {run.env.get('env_key', '?')}: "
        + (counts_line(counts) or "nothing ran")
    ]
    if cached:
        lines.append(f"  {cached} verdicts served from the cache (op, validators and environment unchanged)")
    if other_torch:
        lines.append(
            f"  {other_torch} cells of another torch version left out (their own nox session runs them)"
        )
    ran = sorted((c for c in run.cells if c.verdict.ran), key=lambda c: -c.duration_s)
    if ran[:slowest]:
        lines.append("  slowest: " + ", ".join(f"{c.id} {c.duration_s:.1f} s" for c in ran[:slowest]))
    bad = [c for c in run.cells if c.verdict.is_bad]
    for c in bad[:max_bad]:
        lines.append(f"  {c.verdict.value:<8} {c.id}: {c.reason or _first_bad_check(c)}")
        if c.repro:
            lines.append(f"           repro: {c.repro}")
    if len(bad) > max_bad:
        lines.append(f"  ... and {len(bad) - max_bad} more bad cells (see results.json)")
    broken = collections.Counter(
        (c.cell.mode, getattr(c.check("control"), "summary", c.reason))
        for c in run.cells
        if c.verdict is Verdict.ENVIRONMENT
    )
    lines += [f"  environment x{n}: {mode}: {why}" for (mode, why), n in broken.most_common(5)]
    if run.controls:
        control_counts = collections.Counter(c.verdict for c in run.controls)
        lines.append(f"  {len(run.controls)} environment controls: {counts_line(control_counts)}")
    skips = collections.Counter(c.reason for c in run.cells if c.verdict is Verdict.SKIP)
    lines += [f"  skip x{n}: {reason}" for reason, n in skips.most_common(5)]
    lines.append(f"  results: {out / 'results.json'}  junit: {out / 'junit.xml'}  logs: {out / 'logs'}")
    return "\n".join(lines)


def _first_bad_check(cell: CellResult) -> str:
    for check in cell.checks:
        if check.status.is_bad:
            return f"{check.name}: {check.summary}"
    return cell.verdict.value
