"""``opgate perf {bench,study,block,replay} --out DIR``: GPU performance commands.

Each writes ``DIR/<command>.json``; ``study`` and ``block`` also their
``.md``, and ``bench.json`` is rendered by ``opgate bench --in DIR/bench.json``
(the one benchmark renderer, in reports).  On a machine
without a CUDA device each stops at once with a one-line message (exit code 2);
``bench --dry-run`` prints the plan anywhere.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from opgate.matrix.errors import OpgateError, UsageError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message}")


def shape_arg(text: str) -> tuple[int, ...]:
    """``"32768x8192"`` -> ``(32768, 8192)``."""
    try:
        dims = tuple(int(d) for d in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"a shape is integers joined by x, e.g. 4096x4096; got {text!r}"
        ) from None
    if not dims or any(d <= 0 for d in dims):
        raise argparse.ArgumentTypeError(f"shape dimensions must be positive, got {text!r}")
    return dims


def _csv(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text}")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="opgate perf", description=__doc__.splitlines()[0] if __doc__ else None)
    sub = ap.add_subparsers(dest="command", required=True, parser_class=_Parser)
    bench = sub.add_parser("bench", help="opgate ops vs aten / compile / Liger, forward and backward")
    bench.add_argument(
        "--ops", type=_csv, default=[], help="comma-separated ops (default: every first-party op)"
    )
    bench.add_argument(
        "--shape", type=shape_arg, action="append", default=[], help="e.g. 4096x4096 (repeatable)"
    )
    bench.add_argument(
        "--dtypes", type=_csv, default=[], help="e.g. bf16,fp16 (default: bf16, +fp16/fp32 at largest)"
    )
    bench.add_argument(
        "--directions",
        type=_csv,
        default=["forward", "backward"],
        help="of forward,backward,forward+backward",
    )
    bench.add_argument("--peers", type=_csv, default=[], help="keep only these peers, e.g. aten,liger")
    bench.add_argument("--dry-run", action="store_true", help="print the cases and exit (no GPU needed)")
    bench.add_argument(
        "--context", choices=("graph",), help="run every peer inside the correctness checks' compiled graph"
    )
    study = sub.add_parser("study", help="A/A false alarms and planted-slowdown catch rate of the perf rule")
    study.add_argument("--op", default="rms_norm")
    study.add_argument("--impl", default="triton")
    study.add_argument("--dtype", default="bf16", choices=("fp32", "fp16", "bf16"))
    study.add_argument("--shape", type=shape_arg, action="append", default=[], help="default 8192x8192")
    study.add_argument("--runs", type=_positive, default=20)
    study.add_argument("--history-runs", type=_positive, default=3)
    study.add_argument("--slowdown", type=_fraction, default=0.10, help="planted extra traffic (0.10 = 10%%)")
    rep = sub.add_parser(
        "replay", help="launch replay on the GPU: identical to the Python path, then host us/call"
    )
    rep.add_argument("--ops", type=_csv, default=[], help="comma-separated ops (default: every Triton op)")
    block = sub.add_parser("block", help="decoder block: opgate ops vs stock PyTorch, eager and compiled")
    for name, default in (("hidden", 2048), ("heads", 16), ("seq", 2048), ("batch", 4), ("ffn", 5632)):
        block.add_argument(f"--{name}", type=_positive, default=default)
    block.add_argument("--dtype", default="bf16", choices=("fp32", "fp16", "bf16"))
    block.add_argument("--modes", type=_csv, default=["eager", "compile"], help="eager,compile")
    for p in (bench, study, block, rep):
        p.add_argument("--out", type=Path, required=True, metavar="DIR", help="output folder")
        p.add_argument("--seed", type=int, default=0)
    return ap


def _run(args: argparse.Namespace) -> int:
    if args.command == "bench":
        from opgate.matrix.spec import load_specs
        from opgate.validators.perf.bench import plan, run_bench

        try:
            cases = plan(load_specs(), args.ops, args.shape, args.dtypes, args.directions)
        except ValueError as exc:
            raise UsageError(str(exc)) from exc
        if args.dry_run:
            print("\n".join(c.label for c in cases))
            return 0
        context = None
        if args.context == "graph":
            from opgate.validators.perf.bench import GraphContext

            context = GraphContext()
        data = run_bench(cases, args.out, args.seed, peers=args.peers, context=context)
        print(
            f"bench: {len(data['cases'])} cases in {data['wall_s']} s -> {args.out}/bench.json "
            f"(render: opgate bench --in {args.out}/bench.json)"
        )
        return 0
    if args.command == "replay":
        from opgate.validators.perf.replay_check import run_replay_check

        data = run_replay_check(args.out, args.ops)
        print(f"replay: {data.get('failed', 'ok')} -> {args.out}/replay.json")
        return 1 if "failed" in data else 0
    if args.command == "study":
        from opgate.validators.perf.study import StudyConfig, run_study

        config = StudyConfig(
            op=args.op, impl=args.impl, dtype=args.dtype, shapes=tuple(args.shape) or ((8192, 8192),),
            runs=args.runs, history_runs=args.history_runs, slowdown=args.slowdown, seed=args.seed,
        )  # fmt: skip
        data = run_study(config, args.out)
        print((args.out / "study.md").read_text())
        return 0 if data["meets_bar"] else 1
    from opgate.validators.perf.block import BlockConfig
    from opgate.validators.perf.block_run import run_block

    cfg = BlockConfig(
        hidden=args.hidden, heads=args.heads, seq=args.seq, batch=args.batch, ffn=args.ffn,
        dtype=args.dtype, seed=args.seed,
    )  # fmt: skip
    bad = [m for m in args.modes if m not in ("eager", "compile")]
    if bad or not args.modes:
        raise UsageError(f"block --modes: choose from eager, compile (got {', '.join(args.modes) or 'none'})")
    run_block(cfg, args.out, modes=tuple(args.modes))
    print((args.out / "block.md").read_text())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parser().parse_args(list(sys.argv[1:] if argv is None else argv))
        return _run(args)
    except OpgateError as err:
        print(err.message(), file=sys.stderr)
        return err.exit_code
    except ValueError as exc:  # bad config values (e.g. heads that do not divide hidden)
        print(f"opgate perf: {exc}", file=sys.stderr)
        return UsageError.exit_code


if __name__ == "__main__":
    sys.exit(main())
