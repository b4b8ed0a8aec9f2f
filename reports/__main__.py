"""``opgate {publish,diff,alert}``: the reporting stage's command line.

Every deliberate failure is an :class:`~matrix.errors.OpgateError` with its own
exit code (merge conflict 5, missing shard 6, bad input 7, alert not delivered
8, regressions with ``--fail-on-regression`` 1), printed as one line.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from opgate.matrix.errors import CellsFailed, UsageError
from opgate.matrix.files import write_output
from opgate.matrix.guard import guarded
from opgate.reports import bench_table, compat, diff_md
from opgate.reports import diff as diff_mod
from opgate.reports.alerts.dedup import default_path as default_state_path
from opgate.reports.alerts.registry import PLATFORMS
from opgate.reports.alerts.send import send
from opgate.reports.alerts.transport import RetryPolicy
from opgate.reports.perf import PerfRule
from opgate.reports.publish import publish

#: Bounds of ``alert``'s knobs: a CI step that waits an hour for one chat post is misconfigured.
MAX_ATTEMPTS = 10
MAX_TIMEOUT_S = 3600.0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="opgate", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("publish", help="merge results and write compat.json, compat.md, index.html")
    p.add_argument(
        "--in",
        dest="inputs",
        action="append",
        type=Path,
        default=[],
        metavar="DIR",
        help="a run or shard folder holding results.json (repeatable; none with --manifest: "
        "every planned shard is missing)",
    )
    p.add_argument("--out", type=Path, required=True, help="output folder")
    p.add_argument(
        "--manifest", type=Path, help="plan manifest: refuse to publish if a planned shard is missing"
    )
    p.add_argument("--history", type=Path, help="the previous compat.json, to carry perf history forward")
    p.add_argument(
        "--bench",
        action="append",
        default=[],
        type=Path,
        metavar="FILE",
        help="benchmark JSON to publish as bench.md and a section of compat.md (repeatable)",
    )
    p.add_argument("--block", type=Path, metavar="FILE", help="decoder-block block.json to publish")
    p.add_argument(
        "--strict", action="store_true", help="refuse (exit 6) when a run has planned cells without a verdict"
    )

    b = sub.add_parser("bench", help="render bench.json files (opgate perf bench) as Markdown tables")
    b.add_argument("--in", dest="inputs", action="append", type=Path, required=True, metavar="FILE")
    b.add_argument("--out", type=Path, help="write here instead of stdout")

    inv = sub.add_parser("inventory", help="one row per op: coverage, bound, achieved roofline, fused")
    inv.add_argument("--ops-path", action="append", default=[], type=Path, metavar="DIR")
    inv.add_argument("--bench", action="append", default=[], type=Path, metavar="FILE")
    inv.add_argument("--copy-gbps", type=float, help="copy ceiling (default: measured in a --bench run)")
    inv.add_argument(
        "--gemm-tflops", type=float, help="bf16 GEMM ceiling (default: measured in a --bench run)"
    )
    inv.add_argument("--out", type=Path, help="write here instead of stdout")

    d = sub.add_parser("diff", help="what changed between two compat.json files")
    d.add_argument("--base", type=Path, required=True)
    d.add_argument("--head", type=Path, required=True)
    d.add_argument("--format", choices=("md", "json"), default="md")
    d.add_argument("--out", type=Path, help="write here instead of stdout")
    d.add_argument("--report-url", default="", help="link to the full report, shown in the Markdown")
    d.add_argument(
        "--dashboard-url", default="", help="the published index.html: cell ids link to their evidence"
    )
    d.add_argument("--fail-on-regression", action="store_true", help="exit 1 on new failures/fallbacks/perf")
    d.add_argument("--max-bytes", type=int, default=diff_md.DEFAULT_BUDGET, help="Markdown size budget")
    d.add_argument("--alpha", type=float, default=PerfRule.alpha, help="perf rule: significance level")
    d.add_argument(
        "--min-effect",
        type=float,
        default=PerfRule.min_effect,
        help="perf rule: minimum relative slowdown of the median (0.05 = 5%%)",
    )

    a = sub.add_parser("alert", help="send a JSON diff's regressions to a chat platform")
    a.add_argument("--diff", type=Path, required=True, help="output of `diff --format json`")
    a.add_argument("--platform", choices=sorted(PLATFORMS), required=True)
    a.add_argument("--run-id", help="dedup key part (default: $GITHUB_RUN_ID)")
    a.add_argument("--report-url", default="", help="link to the full report")
    a.add_argument(
        "--dashboard-url", default="", help="the published index.html: each cell links to its evidence"
    )
    a.add_argument(
        "--state",
        type=Path,
        help="JSON file remembering what was already sent (default: ~/.local/state/opgate/alerts-sent.json)",
    )
    a.add_argument("--no-state", action="store_true", help="no dedup state: a re-run posts again")
    a.add_argument(
        "--timeout",
        type=float,
        default=RetryPolicy.timeout,
        help="deadline (s) for the whole delivery, every attempt and wait included",
    )
    a.add_argument("--attempts", type=int, default=4, help="HTTP attempts (>= 1)")
    a.add_argument("--backoff", type=float, default=1.0, help="first retry delay, doubled each time")
    a.add_argument("--max-wait", type=float, default=30.0, help="cap on any one delay, Retry-After included")
    return parser


def _emit(text: str, out: Path | None) -> None:
    """Write ``text`` to ``out`` (parents created) or, without ``--out``, to stdout."""
    if out:
        write_output(out, text)
    else:
        sys.stdout.write(text)


def _publish(args: argparse.Namespace) -> int:
    if not args.inputs and args.manifest is None:
        raise UsageError("publish needs at least one --in DIR (or a --manifest to check against)")
    publish(
        args.inputs,
        args.out,
        manifest=args.manifest,
        history=args.history,
        stream=sys.stdout,
        bench=args.bench,
        block=args.block,
        strict=args.strict,
    )
    return 0


#: The smallest Markdown budget the diff renderer can keep: the headline, every section's
#: "left out" line and the footer (about 1.5 KB with long paths) always fit in it.
MIN_DIFF_BYTES = 4096


def _diff(args: argparse.Namespace) -> int:
    if not 0.0 < args.alpha < 1.0:  # NaN fails both comparisons too
        raise UsageError(f"--alpha {args.alpha:g}: a significance level is between 0 and 1 (e.g. 0.01)")
    if not 0.0 <= args.min_effect <= 1.0:
        raise UsageError(
            f"--min-effect {args.min_effect:g}: a fraction of the median between 0 and 1 (0.05 = 5%)"
        )
    if not MIN_DIFF_BYTES <= args.max_bytes <= diff_md.STEP_SUMMARY_LIMIT:
        raise UsageError(
            f"--max-bytes {args.max_bytes}: between {MIN_DIFF_BYTES} and {diff_md.STEP_SUMMARY_LIMIT} "
            "(GitHub's step summary limit)"
        )
    rule = PerfRule(alpha=args.alpha, min_effect=args.min_effect)
    result = diff_mod.compute(
        compat.load(args.base), compat.load(args.head), str(args.base), str(args.head), rule
    )
    if args.format == "json":
        text = diff_mod.dumps(result)
    else:
        text = diff_md.render(result.to_json(), args.report_url, args.max_bytes, args.dashboard_url)
    _emit(text, args.out)
    if args.fail_on_regression and result.regression_count:
        raise CellsFailed(f"{result.regression_count} regression(s) between {args.base} and {args.head}")
    return 0


def _bench(args: argparse.Namespace) -> int:
    text = bench_table.render(bench_table.load(args.inputs))
    _emit(text, args.out)
    return 0


def _inventory(args: argparse.Namespace) -> int:
    from opgate.reports import inventory

    text = inventory.build(args.ops_path, args.bench, args.copy_gbps, args.gemm_tflops)
    _emit(text, args.out)
    return 0


def _alert(args: argparse.Namespace) -> int:
    if not 1 <= args.attempts <= MAX_ATTEMPTS or not 0 < args.timeout <= MAX_TIMEOUT_S:
        raise UsageError(f"--attempts must be 1..{MAX_ATTEMPTS} and --timeout in (0, {MAX_TIMEOUT_S:g}] s")
    if not (0 <= args.backoff <= MAX_TIMEOUT_S and 0 <= args.max_wait <= MAX_TIMEOUT_S):
        raise UsageError(f"--backoff and --max-wait must be in [0, {MAX_TIMEOUT_S:g}] s")
    if args.no_state and args.state:
        raise UsageError("--state and --no-state exclude each other")
    policy = RetryPolicy(args.timeout, args.attempts, args.backoff, args.max_wait)
    state = None if args.no_state else (args.state or default_state_path())
    send(
        diff_mod.load(args.diff),
        args.platform,
        os.environ,
        run_id=args.run_id,
        report_url=args.report_url,
        dashboard_url=args.dashboard_url,
        state_path=state,
        state_required=args.state is not None,
        policy=policy,
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    handler = {
        "publish": _publish,
        "bench": _bench,
        "inventory": _inventory,
        "diff": _diff,
        "alert": _alert,
    }[args.command]
    return guarded(
        lambda: handler(args), lambda err: f"opgate {args.command}: {type(err).__name__}: {err.message()}"
    )


if __name__ == "__main__":
    sys.exit(main())
