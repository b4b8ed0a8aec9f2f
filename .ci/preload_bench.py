#!/usr/bin/env python3
"""How long a fork server's preload takes, with and without its two speed-ups.

``opgate.validators.worker.preload`` imports what every cell needs (torch,
Triton, Dynamo, Inductor, the checks) with the cyclic garbage collector off,
and hashes Triton's keys on a thread while the rest imports.  This times the
preload of one worker kind in fresh interpreters, alternating four variants
(both speed-ups, either one, neither: the preload as it was), so a slower or
faster host moment hits them alike; the first round only warms the page cache::

    python3 .ci/preload_bench.py cuda --rounds 3 [--ops-path ops]

It prints each variant's times and median.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

#: A child: undo the speed-ups this variant leaves out, then time one preload for forks.
CHILD = """
import gc, json, sys, time
from pathlib import Path
import opgate.validators.worker as worker
gc_off, thread = sys.argv[2] == "1", sys.argv[3] == "1"
if not gc_off:
    gc.disable = lambda: None  # the collector stays on during the imports
if not thread:
    class Inline:  # the hashing runs where the preload joins it, after the imports
        def __init__(self, target, args, daemon):
            self.target, self.args = target, args
        def start(self):
            pass
        def join(self):
            self.target(*self.args)
    worker.threading = type("threading", (), {"Thread": Inline})
t = time.perf_counter()
worker.preload([Path(p) for p in sys.argv[4:]], sys.argv[1], for_forks=True)
print(json.dumps(round(time.perf_counter() - t, 3)))
"""
VARIANTS = {"both": ("1", "1"), "gc off only": ("1", "0"), "thread only": ("0", "1"), "neither": ("0", "0")}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("kind", choices=("cpu", "cuda", "build"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ops-path", action="append", default=[])
    args = ap.parse_args()
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for round_ in range(args.rounds + 1):
        for name, (gc_off, thread) in VARIANTS.items():
            argv = [sys.executable, "-c", CHILD, args.kind, gc_off, thread, *args.ops_path]
            done = subprocess.run(argv, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                print(f"{name}: failed: {done.stderr[-500:]}")
                return 1
            if round_:  # round 0 warms the page cache
                times[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
    for name, secs in times.items():
        print(f"{name:12} median {statistics.median(secs):6.2f} s  ({', '.join(f'{s:.2f}' for s in secs)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
