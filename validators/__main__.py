"""``opgate run``: validate the matrix cells this machine can run.

Exit codes come from :mod:`matrix.errors`: 0 when no cell ended bad, 1
(``CellsFailed``) when one did, and each config / usage problem its own code
with a one-line message, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from opgate.matrix.errors import Interrupted, OpgateError, UsageError
from opgate.matrix.guard import guarded


class _Parser(argparse.ArgumentParser):
    """argparse that raises (so usage errors get opgate's exit code and one line)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message}")


def _positive(kind: type[int] | type[float]) -> type:
    def parse(text: str) -> int | float:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value

    parse.__name__ = kind.__name__
    return parse  # type: ignore[return-value]


def parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="opgate", description=__doc__.splitlines()[0] if __doc__ else None)
    sub = ap.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = sub.add_parser("run", help="run cells in isolated workers, write results.json and junit.xml")
    run.add_argument("--config", type=Path, help="matrix config (default: matrix/default.yaml)")
    run.add_argument("--select", action="append", default=[], metavar="GLOB", help="keep cells matching")
    run.add_argument("--skip", action="append", default=[], metavar="GLOB", help="drop cells matching")
    run.add_argument(
        "--ops-path", action="append", default=[], type=Path, metavar="DIR", help="more op specs"
    )
    run.add_argument("--out", type=Path, required=True, metavar="DIR", help="output folder")
    run.add_argument(
        "--jobs",
        type=_positive(int),
        help="host worker processes (default: half the cores); with --gpu-workers >1 they take cuda "
        "cells once no host cell is left",
    )
    run.add_argument(
        "--gpu-workers",
        type=_positive(int),
        default=1,
        help="worker processes per GPU (default 1; perf timings are only trustworthy with 1)",
    )
    run.add_argument("--timeout", type=_positive(float), metavar="S", help="per-cell timeout for every cell")
    run.add_argument(
        "--memory-mb",
        type=_positive(int),
        metavar="MB",
        help="memory limit of every cell's worker (default: overrides' memory_mb, else 8192)",
    )
    run.add_argument("--retries", type=int, default=1, choices=range(4), help="re-runs of a failed cell")
    run.add_argument(
        "--seed",
        type=int,
        help="input seed for every cell (repro; bypasses the cache); default: fresh per cell",
    )
    run.add_argument(
        "--no-progress", action="store_true", help="no progress bar (terminal) nor per-cell lines (CI)"
    )
    run.add_argument("--no-cache", action="store_true", help="re-run every cell (still refreshes the cache)")
    run.add_argument(
        "--cache-dir",
        type=Path,
        metavar="DIR",
        help="verdict cache (default $OPGATE_CACHE or ~/.cache/opgate/verdicts)",
    )
    run.add_argument(
        "--changed-since",
        metavar="REF",
        help="only the cells a git diff since REF can affect: its ops, the ops importing its files "
        "(every cell when validator code or the matrix config changed)",
    )
    run.add_argument(
        "--keep-warm",
        type=_positive(float),
        metavar="MIN",
        help="keep this run's fork servers (torch imported) for later runs, exiting after MIN minutes "
        "idle, and reuse ones an earlier run kept (default $OPGATE_KEEP_WARM, else off)",
    )
    servers = sub.add_parser("servers", help="list the warm fork servers (--keep-warm), or stop them")
    servers.add_argument("--stop", action="store_true", help="stop every warm server now")
    collect = sub.add_parser(
        "collect", help="write results.json and junit.xml from the cells/ of an interrupted run"
    )
    collect.add_argument("--out", type=Path, required=True, metavar="DIR", help="the run's output folder")
    cmp = sub.add_parser(
        "compact", help="keep finished runs in a repository: only what verdicts, tables and history read"
    )
    cmp.add_argument("dirs", type=Path, nargs="+", metavar="DIR", help="finished run folders")
    cmp.add_argument(
        "--into", type=Path, required=True, metavar="DIR", help="write each run to DIR/<its folder name>"
    )
    brk = sub.add_parser("breakdown", help="where a finished run's wall time went (build, compile, harness)")
    brk.add_argument(
        "dirs", type=Path, nargs="+", metavar="DIR", help="run folders (results.json + run.json)"
    )
    brk.add_argument("--json", action="store_true", help="JSON instead of the table")
    return ap


def _collect(out: Path) -> int:
    from opgate.validators.collect import collect as collect_cells
    from opgate.validators.outlock import OutputLock

    if not out.is_dir():  # a typo: said, and nothing made there (the lock would make the folder)
        raise UsageError(f"--out {out}: no such run folder")
    with OutputLock(out, "opgate collect"):
        done = collect_cells(out, note="collected after the run")
    print(f"{len(done.cells)} cells -> {out / 'results.json'}, {out / 'junit.xml'}")
    if done.missing:
        print(f"incomplete: {len(done.missing)} planned cell(s) did not finish", file=sys.stderr)
    return 0


def _compact(dirs: Sequence[Path], into: Path) -> int:
    from opgate.validators.compact import compact_runs

    done = compact_runs(dirs, into)
    for run in done:
        print(
            f"{run.source} -> {run.dest}: {run.cells} cells, results.json "
            f"{run.bytes_before / 1e6:.2f} MB -> {run.bytes_after / 1e6:.2f} MB"
        )
    return 0


def _servers(stop: bool) -> int:
    from opgate.validators.warmserver import main_servers

    return main_servers(stop)


def _breakdown(dirs: Sequence[Path], as_json: bool) -> int:
    import json

    from opgate.matrix.errors import ResultsFormatError
    from opgate.matrix.files import read_json
    from opgate.validators.breakdown import breakdown, format_breakdown

    out = {}
    for folder in dirs:
        absent = [n for n in ("results.json", "run.json") if not (folder / n).is_file()]
        if absent:
            raise ResultsFormatError(f"{folder}: not a finished run folder (no {' or '.join(absent)})")
        doc = read_json(folder / "results.json", what="results", expect=dict)
        cells, controls = doc.get("cells"), doc.get("controls") or []
        run = read_json(folder / "run.json", what="run record", expect=dict)
        if not isinstance(cells, list) or not isinstance(controls, list):
            raise ResultsFormatError(f"{folder / 'results.json'}: no list of cells: not a finished run")
        try:
            out[str(folder)] = breakdown(cells, run, controls)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            why = f"{type(exc).__name__}: {exc}"
            raise ResultsFormatError(f"{folder}: not a finished run folder ({why})") from exc
    if as_json:
        print(json.dumps(out, indent=1))
    else:
        print("\n\n".join(f"{name}\n{format_breakdown(b)}" for name, b in out.items()))
    return 0


def _env_minutes(name: str) -> float | None:
    """A number of minutes from the environment (unset or empty: None; 0 turns it off)."""
    import os

    text = os.environ.get(name, "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"${name}={text!r}: not a number of minutes") from None
    if value < 0:
        raise UsageError(f"${name}={text!r}: minutes must be >= 0")
    return value or None


def _run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from opgate.validators.options import RunOptions
    from opgate.validators.runner import Runner

    options = RunOptions(
        out=args.out,
        config=args.config,
        select=args.select,
        skip=args.skip,
        ops_paths=args.ops_path,
        jobs=args.jobs,
        gpu_workers=args.gpu_workers,
        timeout_s=args.timeout,
        memory_mb=args.memory_mb,
        retries=args.retries,
        seed=args.seed,
        progress=not args.no_progress,
        use_cache=not args.no_cache,
        cache_dir=args.cache_dir,
        changed_since=args.changed_since,
        keep_warm_min=args.keep_warm if args.keep_warm is not None else _env_minutes("OPGATE_KEEP_WARM"),
        argv=["python", "-m", "opgate.validators", *argv],
    )
    runner = Runner(options)
    try:
        _, code = runner.execute()
    except KeyboardInterrupt:
        if not runner.owns_output:  # interrupted before it held --out: nothing of its own to keep
            raise
        from opgate.validators.collect import collect

        try:
            done = collect(args.out, list(options.argv))
        except OpgateError:
            print("interrupted before any cell finished", file=sys.stderr)
        else:
            missing = f"; {len(done.missing)} planned cell(s) missing" if done.missing else ""
            print(
                f"interrupted: {len(done.cells)} finished cells written to {args.out / 'results.json'}"
                f"{missing}",
                file=sys.stderr,
            )
        finally:
            runner.release()
        return Interrupted.exit_code
    return code


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)

    def command() -> int:
        args = parser().parse_args(argv)
        folder_commands = {
            "collect": lambda: _collect(args.out),
            "compact": lambda: _compact(args.dirs, args.into),
            "breakdown": lambda: _breakdown(args.dirs, as_json=args.json),
            "servers": lambda: _servers(args.stop),
        }
        if args.command in folder_commands:
            return folder_commands[args.command]()
        return _run(args, argv)

    return guarded(command)


if __name__ == "__main__":
    sys.exit(main())
