"""``opgate list|plan``: the cells of the matrix, and their CI shards.

Both commands read YAML only: they never import torch (nor any op), so they
answer in well under two seconds on a bare CI runner.  Errors print one
``file:line: problem (hint)`` line each to stderr and exit with the error's
own exit code (see :mod:`matrix.errors`).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from opgate.matrix import expand_torches, narrow
from opgate.matrix.errors import UsageError
from opgate.matrix.files import write_output
from opgate.matrix.guard import guarded

if TYPE_CHECKING:
    from opgate.matrix.cell import Cell
    from opgate.matrix.config import MatrixConfig


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", type=Path, default=None, help="matrix config (default: matrix/default.yaml)"
    )
    parser.add_argument(
        "--ops-path", type=Path, action="append", default=[], metavar="DIR", help="extra op specs"
    )
    parser.add_argument(
        "--select", action="append", default=[], metavar="GLOB", help="keep matching cell ids"
    )
    parser.add_argument("--skip", action="append", default=[], metavar="GLOB", help="drop matching cell ids")
    parser.add_argument(
        "--torch",
        action="append",
        default=[],
        metavar="VERSION",
        help="torch version standing in for 'installed' (default: metadata); repeat for several",
    )
    parser.add_argument(
        "--changed-since",
        default=None,
        metavar="REF",
        help="only cells a git diff since REF can affect (every cell when harness code changed)",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="opgate", description=__doc__.split("\n", 1)[0])
    sub = parser.add_subparsers(dest="command", required=True)
    lst = sub.add_parser("list", help="print cell ids (one per line) or --json")
    _common(lst)
    lst.add_argument("--json", action="store_true", help="a JSON list of cells with every axis")
    plan = sub.add_parser("plan", help="shard the cells for CI")
    _common(plan)
    plan.add_argument("--format", choices=("gha", "json"), default="gha")
    plan.add_argument(
        "--max-jobs", type=int, default=None, metavar="N", help="at most N shards (default 64, <= 256)"
    )
    plan.add_argument(
        "--history", type=Path, default=None, metavar="FILE", help="previous compat.json/results.json"
    )
    plan.add_argument(
        "--target-s", type=float, default=None, metavar="S", help="split groups longer than S seconds"
    )
    plan.add_argument(
        "--manifest", type=Path, default=None, metavar="FILE", help="write shard names + cell ids"
    )
    plan.add_argument(
        "--runner",
        action="append",
        default=[],
        metavar="ARCH=LABEL,...",
        help="runner labels for an arch, instead of the matrix file's runners: (repeatable)",
    )
    return parser


def _runners(
    config_runners: Mapping[str, Sequence[str]], overrides: Sequence[str]
) -> dict[str, tuple[str, ...]]:
    """The matrix file's ``runners:`` with each ``--runner ARCH=LABEL,...`` replacing its arch's labels."""
    from opgate.matrix.cell import ARCHES

    runners = {arch: tuple(labels) for arch, labels in config_runners.items()}
    for text in overrides:
        arch, _, labels = text.partition("=")
        names = tuple(label.strip() for label in labels.split(",") if label.strip())
        if (
            arch.strip() not in ARCHES
            or not names
            or not all(re.fullmatch(r"[A-Za-z0-9_.-]+", n) for n in names)
        ):
            raise UsageError(
                f"--runner {text!r}: expected ARCH=LABEL[,LABEL...] with ARCH one of {', '.join(ARCHES)}"
            )
        runners[arch.strip()] = names
    return runners


def _torch_versions(values: Sequence[str]) -> list[str]:
    """``--torch`` values: torch releases, one per id column (as the config's ``torch`` list)."""
    from opgate.matrix.cell import torch_major_minor
    from opgate.matrix.config import TORCH_VERSION

    columns: dict[str, str] = {}
    for value in values:
        if not re.fullmatch(TORCH_VERSION, value):
            raise UsageError(f"--torch {value!r}: not a torch version (e.g. 2.13.0 or 2.14.1+cu130)")
        column = torch_major_minor(value)
        if column in columns:
            raise UsageError(
                f"--torch {columns[column]} and --torch {value} share the id column pt{column}: "
                "give each major.minor once"
            )
        columns[column] = value
    return list(columns.values())


def _cells(args: argparse.Namespace) -> tuple[list[Cell], list[Cell], MatrixConfig]:
    """(universe, selected cells, config): the config's cells, then --select/--skip, then --changed-since."""
    from opgate.matrix.config import load_config
    from opgate.matrix.spec import load_specs

    config = load_config(args.config)
    specs = load_specs(args.ops_path)
    universe = expand_torches(config, specs, _torch_versions(args.torch))
    cells = narrow(universe, args.select, args.skip)
    if args.changed_since is not None:
        from opgate.matrix.changes import narrow_to_changes

        cells, affected = narrow_to_changes(cells, specs, args.config, args.changed_since)
        print(f"opgate: {affected.describe()}: {len(cells)} cell(s)", file=sys.stderr)
    return universe, cells, config


def _list(args: argparse.Namespace) -> str:
    _, cells, _ = _cells(args)
    if args.json:
        return json.dumps([c.to_json() for c in cells], indent=1)
    return "\n".join(c.id for c in cells)


def _plan(args: argparse.Namespace) -> str:
    from opgate.matrix import plan as planmod

    longest = planmod.MAX_DURATION_S
    if args.target_s is not None and not 1.0 <= args.target_s <= longest:
        raise UsageError(f"--target-s {args.target_s}: seconds per job, from 1 to {longest:.0f}")
    universe, cells, config = _cells(args)
    runners = _runners(config.runners, args.runner)
    plan = planmod.make_plan(
        cells,
        runners,
        universe=universe,
        max_jobs=planmod.DEFAULT_MAX_JOBS if args.max_jobs is None else args.max_jobs,
        history=planmod.load_history(args.history) if args.history else None,
        target_s=planmod.DEFAULT_TARGET_S if args.target_s is None else args.target_s,
        runners_where=config.where("runners"),
    )
    text = plan.gha_json()  # the size check applies to both formats: json feeds the same jobs
    if args.manifest is not None:
        write_output(args.manifest, json.dumps(plan.manifest(), indent=1) + "\n")
    if args.format == "json":
        return json.dumps({"include": [s.to_gha() for s in plan.shards]}, indent=2)
    return text


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)

    def command() -> int:
        out = _list(args) if args.command == "list" else _plan(args)
        if out:
            print(out, flush=True)
        return 0

    return guarded(command)


if __name__ == "__main__":
    sys.exit(main())
