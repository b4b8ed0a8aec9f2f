#!/usr/bin/env python3
"""Where a fresh worker's first cell spends its time: each cell in its own forked child, profiled.

    python3 .ci/firstcell.py --select 'rope.*-cudagraphs' --n 4 --out out/firstcell [--kind cuda]
        [--no-precompute] [--per-child K] [--stacks]

This process preloads as a fork server does (:func:`opgate.validators.worker.preload`),
then forks one child per cell, as an isolated cell's worker is forked: the child makes
its CUDA context (a worker does before its hello), then runs the cell while a thread
samples its stack every 5 ms (the checks use ``sys.setprofile`` themselves, so cProfile
cannot).  Per cell it writes the check durations and the sampled functions, inclusive
and leaf (``<out>/<n>-<k>.txt``) and one JSON line to ``<out>/cells.jsonl``.  ``--per-child K``:
each child runs K cells in turn, so a worker's first cell and its later ones compare directly;
``--stacks`` also writes every sampled stack (``<n>-<k>.stacks.json``), to see who calls what.
``--no-precompute`` leaves out what the server computes before forking
(:func:`opgate.validators.worker.precompute_keys`), so the difference is what each fresh
worker would pay.  A diagnostic: the verdicts of these children are not opgate's
verdicts (no retries, no cache, every check of the mode that ``OPGATE_SKIP_CHECKS``
leaves on: ``.ci/gpu``'s step leaves perf off).
"""

from __future__ import annotations

import argparse
import collections
import fnmatch
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any


class Sampler(threading.Thread):
    """Samples one thread's stack: per function, the seconds it was on the stack and at its top."""

    def __init__(self, ident: int, every_s: float = 0.005) -> None:
        super().__init__(daemon=True)
        self.target, self.every_s = ident, every_s
        #: whole stacks, outermost frame first: the report's counts derive from them (``--stacks``
        #: writes them, to see who calls what the report names)
        self.stacks: collections.Counter[tuple[str, ...]] = collections.Counter()
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.every_s):
            frame = sys._current_frames().get(self.target)
            stack: list[str] = []
            while frame is not None:
                code = frame.f_code
                where = code.co_filename.rsplit("site-packages/", 1)[-1]
                stack.append(f"{where}:{code.co_firstlineno}({code.co_name})")
                frame = frame.f_back
            if stack:
                self.stacks[tuple(reversed(stack))] += 1

    def report(self, top: int) -> str:
        inclusive: collections.Counter[str] = collections.Counter()
        leaf: collections.Counter[str] = collections.Counter()
        for stack, n in self.stacks.items():
            leaf[stack[-1]] += n
            for name in set(stack):  # a recursive function counts once per sample
                inclusive[name] += n
        lines = []
        for title, counter in (("on the stack", inclusive), ("at the top", leaf)):
            lines.append(f"-- {title} (s)")
            lines += [f"{n * self.every_s:8.2f}  {name}" for name, n in counter.most_common(top)]
        return "\n".join(lines) + "\n"


def _child(cells: list[tuple[Any, Any]], run_cell: Any, args: argparse.Namespace, n: int) -> None:
    """One fresh worker: its CUDA context, then ``cells`` one after the other (``--per-child``)."""
    kind, out, top, stacks = args.kind, args.out, args.top, args.stacks
    import torch

    from opgate.validators.result import combine
    from opgate.validators.worker import warm_cuda

    t0 = time.perf_counter()
    if kind == "cuda":
        warm_cuda(torch)
    context_s = time.perf_counter() - t0
    for k, (cell, spec) in enumerate(cells):
        sampler = Sampler(threading.get_ident())
        t1 = time.perf_counter()
        sampler.start()
        result = run_cell(cell, spec, "cuda:0" if kind == "cuda" else "cpu", 1234, out / f"work-{n}-{k}")
        sampler.stop.set()
        sampler.join()
        cell_s = time.perf_counter() - t1
        checks = {c.name: round(c.duration_s, 3) for c in result.checks}
        line = {
            "cell": cell.id,
            "in_worker": k + 1,  # 1: the worker's first cell
            "verdict": (result.verdict or combine(result.checks)).value,
            "context_s": round(context_s, 3),
            "cell_s": round(cell_s, 3),
            "checks": checks,
        }
        (out / f"{n}-{k}.txt").write_text(json.dumps(line) + "\n" + sampler.report(top))
        if stacks:  # one line per distinct stack: seconds, then its frames outermost first
            rows = [[round(c * sampler.every_s, 3), *st] for st, c in sampler.stacks.most_common()]
            (out / f"{n}-{k}.stacks.json").write_text(json.dumps(rows))
        with (out / "cells.jsonl").open("a") as f:
            f.write(json.dumps(line) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--select", required=True, help="glob over cell ids")
    ap.add_argument("--n", type=int, default=4, help="how many of the selected cells")
    ap.add_argument("--kind", default="cuda", choices=("cpu", "cuda"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--top", type=int, default=40, help="profile lines per ordering")
    ap.add_argument("--no-precompute", action="store_true")
    ap.add_argument("--stacks", action="store_true", help="also write each cell's sampled stacks")
    ap.add_argument(
        "--per-child", type=int, default=1, help="cells each child runs in turn (the first is its first cell)"
    )
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # as the fork server: forks stay usable
    from opgate.validators import worker

    t = time.perf_counter()
    specs, run_cell = worker.preload([], args.kind, for_forks=not args.no_precompute)
    server = {"preload_s": round(time.perf_counter() - t, 3)}
    print(json.dumps(server), file=sys.stderr)
    import torch

    from opgate.matrix.config import load_config
    from opgate.matrix.expand import expand

    cells = [
        c for c in expand(load_config(None), specs, torch.__version__) if fnmatch.fnmatch(c.id, args.select)
    ]
    if not cells:
        print(f"no cell matches {args.select!r}", file=sys.stderr)
        return 2
    chosen = cells[: args.n * args.per_child]
    for n in range(0, len(chosen), args.per_child):
        mine = [(cell, specs[cell.op]) for cell in chosen[n : n + args.per_child]]
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                _child(mine, run_cell, args, n)
            except BaseException:  # noqa: BLE001 - the child must never return into the parent's loop
                import traceback

                traceback.print_exc()
                code = 1
            finally:
                sys.stderr.flush()
                os._exit(code)
        os.waitpid(pid, 0)
        for k, (cell, _) in enumerate(mine):
            report = args.out / f"{n}-{k}.txt"
            said = report.read_text().splitlines()[0] if report.exists() else f"{cell.id}: no result"
            print(said, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
