"""Every error opgate raises on purpose, each with its own process exit code.

One module, so that a CI step can tell *why* opgate stopped from the exit code
alone: a bad config (fix the YAML) is not a failing cell (fix the kernel), and
neither is a missing shard (re-run the workflow).  All stages (matrix,
validators, reports) raise these; ``main`` wrappers turn them into a one-line
message and ``sys.exit(err.exit_code)``.
"""

from __future__ import annotations

from dataclasses import dataclass


class OpgateError(Exception):
    """Base class: a clear, user-facing failure (never a traceback)."""

    exit_code = 10

    def __str__(self) -> str:
        return self.message()

    def message(self) -> str:
        return super().__str__()


class CellsFailed(OpgateError):
    """At least one cell ended ``fail``/``fallback``/``error``/``flaky``: the gate is red."""

    exit_code = 1


class UsageError(OpgateError):
    """Bad command-line arguments."""

    exit_code = 2


class OutputError(UsageError):
    """An output path cannot be written: a file where a folder must be, read-only, disk full.

    A usage problem (exit 2): the command was fine, the place it was told to
    write to is not; nothing about a cell or an input file is wrong.
    """


class BusyOutput(UsageError):
    """Another opgate process is writing the same output folder: running both would lose verdicts."""


@dataclass(frozen=True)
class Location:
    """A place in a YAML file, for ``file:line`` messages."""

    path: str
    line: int  # 1-based

    def __str__(self) -> str:
        return f"{self.path}:{self.line}"


class ConfigError(OpgateError):
    """Matrix config or op spec is malformed.  Always says where, and how to fix it."""

    exit_code = 3

    def __init__(self, problem: str, where: Location | None = None, hint: str | None = None) -> None:
        super().__init__(problem)
        self.problem = problem
        self.where = where
        self.hint = hint

    def message(self) -> str:
        prefix = f"{self.where}: " if self.where else ""
        suffix = f" ({self.hint})" if self.hint else ""
        return f"{prefix}{self.problem}{suffix}"


class ConfigErrors(ConfigError):
    """Several config problems reported at once, so one run shows them all."""

    def __init__(self, errors: list[ConfigError]) -> None:
        super().__init__(f"{len(errors)} config error(s)")
        self.errors = errors

    def message(self) -> str:
        return "\n".join(e.message() for e in self.errors)


class SelectionEmpty(OpgateError):
    """``--select`` / ``--skip`` left no cell: almost always a typo in a glob."""

    exit_code = 4


class MergeConflict(OpgateError):
    """Two result files disagree on the verdict of the same cell in the same environment."""

    exit_code = 5


class MissingShard(OpgateError):
    """A planned shard did not report: publishing would silently drop cells."""

    exit_code = 6


class ResultsFormatError(OpgateError):
    """A results/compat file is not what this opgate version writes."""

    exit_code = 7


class AlertDeliveryFailed(OpgateError):
    """A chat alert could not be delivered (never changes a verdict)."""

    exit_code = 8


class Interrupted(OpgateError):
    """SIGINT or SIGTERM (a cancelled CI job): 128 + SIGINT, whichever signal it was."""

    exit_code = 130
