"""``opgate COMMAND ...``: the one console command, dispatching to each stage's own CLI.

It lives in the last stage because only the last stage may import every
other one (matrix -> validators -> reports).  Each stage keeps its own parser
and ``main``, which is what ``python -m opgate.<stage>`` runs too; this table
only says which stage owns which subcommand, and each stage is imported only
when its command runs (``opgate list`` never imports the validators, let
alone torch).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence

from opgate.matrix.guard import guarded

#: subcommand -> (module whose ``main(argv)`` runs it, one-line help).
COMMANDS: dict[str, tuple[str, str]] = {
    "init": ("opgate.matrix.scaffold", "scaffold a new op folder: spec, reference, Triton kernel, test"),
    "list": ("opgate.matrix.__main__", "print the matrix's cell ids (never imports torch)"),
    "plan": ("opgate.matrix.__main__", "shard the cells for CI"),
    "run": ("opgate.validators.__main__", "validate the cells this machine can run"),
    "collect": ("opgate.validators.__main__", "assemble results.json from an interrupted run's cells"),
    "breakdown": ("opgate.validators.__main__", "where a finished run's wall time went"),
    "compact": ("opgate.validators.__main__", "keep finished runs in a repository, compact"),
    "servers": ("opgate.validators.__main__", "list or stop the warm fork servers (run --keep-warm)"),
    "perf": ("opgate.validators.perf.__main__", "GPU benchmarks: bench, study, block"),
    "publish": ("opgate.reports.__main__", "merge results into compat.json, compat.md, index.html"),
    "bench": ("opgate.reports.__main__", "render committed benchmark results as Markdown"),
    "inventory": ("opgate.reports.__main__", "one row per op: coverage, bound, roofline, fused"),
    "diff": ("opgate.reports.__main__", "what changed between two compat.json files"),
    "alert": ("opgate.reports.__main__", "post a diff's regressions to chat platforms"),
}
#: Commands whose module's parser does not expect the command word: ``opgate perf bench`` is
#: ``python -m opgate.validators.perf bench``, ``opgate init DIR`` ``python -m opgate.matrix.scaffold DIR``.
_STRIPPED = frozenset({"perf", "init"})


def _usage() -> str:
    width = max(map(len, COMMANDS))
    rows = "\n".join(f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items())
    return (
        "usage: opgate COMMAND [ARGS...]\n\n"
        "Validate PyTorch custom ops across a compatibility matrix.\n\n"
        f"commands:\n{rows}\n\n"
        "`opgate COMMAND --help` describes each. Exit codes: 0 ok, 1 a cell is bad, 2 usage,\n"
        "3 config or spec error, 4 selection empty, 5 merge conflict, 6 planned shard missing,\n"
        "7 unreadable results, 8 alert not delivered, 130 interrupted.\n"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        sys.stderr.write(_usage())
        return 2
    if args[0] in ("-h", "--help", "help"):
        sys.stdout.write(_usage())
        return 0
    if args[0] == "--version":
        from importlib.metadata import PackageNotFoundError, version

        try:
            sys.stdout.write(f"opgate {version('opgate')}\n")
        except PackageNotFoundError:
            sys.stdout.write("opgate (not installed)\n")
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        sys.stderr.write(f"opgate: unknown command {name!r}\n\n{_usage()}")
        return 2
    stage_main: Callable[[Sequence[str]], int] = importlib.import_module(COMMANDS[name][0]).main
    # each stage's main has its own error path (matrix.guard); this one covers a stage without it
    return guarded(lambda: stage_main(rest if name in _STRIPPED else [name, *rest]))


if __name__ == "__main__":
    sys.exit(main())
