#!/usr/bin/env python3
"""On a GPU: does a precompiled Triton variant spare the launch its compile?

    python3 .ci/probe_precompile.py [--out DIR]

Three fresh processes, the way a run and the next one use them:

    record     rope's kernel launched forward and backward for each dtype and shape, in an empty
               Triton cache, with a worker's recorder on (opgate.validators.tritonvariants):
               what it recorded, and how long its first launches took
    precompile a second empty cache: the recorded variants compiled by the precompile processes
    launch     the same launches in that second cache: the kernel cache entries before and after
               (equal: every launch found its variant compiled) and how long they took

Prints one JSON object; exit 1 when a launch compiled something the precompile should have.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LAUNCH = r"""
import json, os, sys, time, torch
from opgate.validators import tritonvariants
from opgate.ops.rope.reference import sample_inputs
from opgate.ops.rope.triton_impl import rope
tritonvariants.install_recorder()
tritonvariants.set_current("rope.triton")
g = torch.Generator().manual_seed(0)  # sample inputs draw on the CPU
t = time.monotonic()
for dtype in (torch.float32, torch.float16, torch.bfloat16):
    for shape in ([2, 37, 4, 64, 0], [1, 19, 3, 96, 1]):
        s = sample_inputs(tuple(shape), dtype, "cuda", g)
        q, k = (a.detach().requires_grad_() for a in s.args[:2])
        out = rope(q, k, *s.args[2:], **s.kwargs)
        sum(o.float().sum() for o in out).backward()
torch.cuda.synchronize()
print(json.dumps({"launch_s": round(time.monotonic() - t, 2)}))
"""


def _entries(cache: Path) -> int:
    return len({p.parent for p in cache.rglob("*.cubin")})


def _launch(cache: Path, record: Path) -> dict[str, float]:
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache), "OPGATE_TRITON_VARIANTS": str(record)}
    argv = [sys.executable, "-c", LAUNCH]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if proc.returncode:
        sys.exit(f"the launches failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(tempfile.mkdtemp(prefix="opgate-probe-")))
    args = ap.parse_args()
    from opgate.validators import tritonvariants

    first, second, record = args.out / "cache-1", args.out / "cache-2", args.out / "recorded"
    report: dict[str, object] = {"record": _launch(first, record)}
    variants = [json.loads(x) for x in (record / "rope.triton.jsonl").read_text().splitlines()]
    report["recorded_variants"] = len(variants)
    report["cache_entries_after_record"] = _entries(first)
    t = time.monotonic()
    env = {**os.environ, "TRITON_CACHE_DIR": str(second)}
    launch = tritonvariants.fresh_interpreter(env)
    todo = {"rope.triton": variants}
    run = tritonvariants.start(args.out / "work", todo, cores=8, launch=launch, sys_path=[])
    assert run is not None
    assert run.proc is not None
    while run.proc.poll() is None:
        time.sleep(0.05)
    report["precompile"] = {**run.stop(), "wall_s": round(time.monotonic() - t, 2)}
    before = _entries(second)
    report["launch"] = _launch(second, args.out / "recorded-again")
    report["cache_entries"] = {"after_precompile": before, "after_launch": _entries(second)}
    print(json.dumps(report, indent=1))
    return 0 if before == _entries(second) and before > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
