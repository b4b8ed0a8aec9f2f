"""Progress bar for long runs, and the terminal summary at the end.

The bar goes to stderr and only to a terminal: CI logs stay clean, and a
``--no-progress`` switch covers terminals that do not want it.  tqdm is used
when installed; otherwise a one-line bar needs nothing.  The summary is the
part a human reads after a run: verdict counts, wall time, the slowest cells,
and every bad cell with its reason.
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


class Progress:
    """``update`` once per finished cell; ``close`` at the end (also on interrupt)."""

    def __init__(self, total: int, enabled: bool = True, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.total = total
        self.done = 0
        self.counts: collections.Counter[Verdict] = collections.Counter()
        self.t0 = time.monotonic()
        self.enabled = enabled and total > 0 and self.stream.isatty()
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
        if not self.enabled:
            return
        if self._tqdm is not None:
            self._tqdm.set_postfix_str(counts_line(self.counts), refresh=False)
            self._tqdm.update(1)
            return
        self.stream.write("\r" + self.line(result.id) + "\x1b[K")
        self.stream.flush()

    def line(self, last: str = "") -> str:
        """``[=====>    ]  12/345  pass 10  fail 1  00:32 eta 04:10  <last cell>``."""
        elapsed = time.monotonic() - self.t0
        eta = elapsed / self.done * (self.total - self.done) if self.done else 0.0
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
    lines += [f"  {c.verdict.value:<8} {c.id}: {c.reason or _first_bad_check(c)}" for c in bad[:max_bad]]
    if len(bad) > max_bad:
        lines.append(f"  ... and {len(bad) - max_bad} more bad cells (see results.json)")
    skips = collections.Counter(c.reason for c in run.cells if c.verdict is Verdict.SKIP)
    lines += [f"  skip x{n}: {reason}" for reason, n in skips.most_common(5)]
    lines.append(f"  results: {out / 'results.json'}  junit: {out / 'junit.xml'}  logs: {out / 'logs'}")
    return "\n".join(lines)


def _first_bad_check(cell: CellResult) -> str:
    for check in cell.checks:
        if check.status.is_bad:
            return f"{check.name}: {check.summary}"
    return cell.verdict.value
