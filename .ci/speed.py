#!/usr/bin/env python3
"""What re-validation costs: cold, warm, one op changed, nothing changed (issue: a PR gate in seconds).

    python3 .ci/speed.py --out out/speed [--select GLOB ...] [-- opgate run args]

Runs ``opgate run`` four times on the same selection, with private build,
compile and verdict caches under ``--out`` (nothing else on the machine is
touched or reused):

    cold      every cache emptied first (Triton, Inductor, opgate builds, verdicts); the
              ccache of Inductor's C++ compiles is ``OPGATE_BUILD_CACHE/ccache``, emptied with
              the builds (a ``CCACHE_DIR`` of the caller's is not passed on)
    warm      build and compile caches warm, the verdict cache bypassed (--no-cache)
    one-op    after a change to one op's kernel source (--probe), verdict cache on
    nothing   nothing changed since: every verdict served from the cache

Python's bytecode is not one of those caches: where the interpreter keeps none
(``PYTHONDONTWRITEBYTECODE`` images), ``opgate run`` keeps it in opgate's user
cache folder (:mod:`opgate.validators.bytecode`), as an image without that
setting keeps ``.pyc`` files beside its sources, and cold does not empty it.
``.ci/gpu``'s ``bytecode`` step measures what the first run on a machine pays.

It writes ``speed.json`` and ``speed.md``: per scenario the wall time of the
whole ``opgate run`` process and of the run itself, the CPU time of the
process tree, the cells run and cached, the time breakdown (``opgate
breakdown``) with the harness share of ``wall x busy lanes``, and the machine's
load average before and after (the CPU machine is shared: say how loaded it
was), and the entries each run added to the Triton and Inductor caches (what
it compiled rather than found).  The probe is undone afterwards, whatever happens.  ``--repeat N`` runs
one-op and nothing N times, all kept: each one-op repeat makes a change of its
own (the first counts, the others are said beside it), the fastest nothing counts.

``--keep-warm MIN`` passes ``--keep-warm MIN`` to every run, with a private
server folder: cold starts the fork servers (and pays their imports), the
later scenarios fork from them, as a developer's edit-run loop or a
persistent GPU runner would; the servers are stopped at the end.  ``--gap S``
waits S seconds before each scenario after the first: back to back (the
default, 0) a run finds the standby workers the last one left still making
their CUDA contexts, where a pull request arriving later finds them ready.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: The default probe: a comment inside rope's Triton kernel, so the kernel's source (what
#: Triton hashes, and what opgate's verdict cache digests) changes and nothing else does.
PROBE_FILE = "ops/rope/triton_impl.py"
PROBE_ANCHOR = "    pid = tl.program_id(0)"
PROBE_LINE = "    # opgate speed probe: this kernel's source changed\n"
KEEP_RUNS = False
GAP_S = 0.0
_STARTED: list[str] = []  # the runs so far: each after the first waits GAP_S


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _run(name: str, out: Path, args: list[str], env: dict[str, str]) -> dict[str, Any]:
    folder = out / "runs" / name
    if _STARTED:
        time.sleep(GAP_S)  # before each run after the first (module doc)
    _STARTED.append(name)
    argv = [sys.executable, "-m", "opgate.reports.cli", "run", "--out", str(folder), "--no-progress", *args]
    before = _cache_entries(env)
    load, cpu, t = _load(), _cpu_s(), time.monotonic()
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    wall, cpu = time.monotonic() - t, _cpu_s() - cpu
    after = _cache_entries(env)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    (out / "logs" / f"{name}.log").write_text(proc.stdout + proc.stderr)
    record: dict[str, Any] = {
        "scenario": name,
        "rc": proc.returncode,
        "process_wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "load_before": load,
        "load_after": _load(),
        # what the run compiled: the entries it added to Triton's cache (a kernel variant or a
        # launcher each, the precompile's included) and to Inductor's (FX graphs, AOT autograd)
        "new_cache_entries": {k: len(after[k] - before[k]) for k in after},
    }
    try:
        run = json.loads((folder / "run.json").read_text())
    except (OSError, ValueError):
        record["error"] = (proc.stderr.strip().splitlines() or ["no run.json"])[-1]
        return record
    record["timings"] = run.get("timings", {})
    record["fork_server_preload_s"] = run.get("fork_server_preload_s", {})
    record["warm_servers"] = run.get("warm_servers", {})
    record["bytecode_cache"] = run.get("bytecode_cache", {})
    record["breakdown"] = run.get("breakdown", {})
    record["workers"] = len(run.get("workers") or [])
    record["standby_workers"] = sum("standby" in w for w in run.get("workers") or [])  # warm before the run
    if not KEEP_RUNS:  # results.json, run.json and the workers' own logs say it all
        for part in ("cells", "work"):
            shutil.rmtree(folder / part, ignore_errors=True)
        for log in (folder / "logs").glob("*.log"):
            log.unlink()
    return record


def _cache_entries(env: dict[str, str]) -> dict[str, set[str]]:
    """The entries of the runs' Triton cache (its folders) and Inductor's graph caches (their files)."""
    out: dict[str, set[str]] = {"triton": set(), "inductor": set()}
    triton = Path(env["TRITON_CACHE_DIR"])
    if triton.is_dir():
        out["triton"] = {p.name for p in triton.iterdir() if p.is_dir()}
    inductor = Path(env["TORCHINDUCTOR_CACHE_DIR"])
    for part in ("fxgraph", "aotautograd"):
        if (inductor / part).is_dir():
            out["inductor"] |= {str(f) for f in (inductor / part).rglob("*") if f.is_file()}
    return out


def _preload_profile(env: dict[str, str], kind: str) -> list[tuple[str, float]]:
    """Where a fork server's imports go: the slowest modules by cumulative import time (s)."""
    code = (
        f"from opgate.validators.worker import preload; preload([], {kind!r}); import torch, sys; "
        "print('cuda initialised by the preload:', torch.cuda.is_initialized(), file=sys.stderr)"
    )
    env = {**env, "CUDA_VISIBLE_DEVICES": "" if kind != "cuda" else env.get("CUDA_VISIBLE_DEVICES", "0")}
    if kind == "cpu":
        env["TRITON_INTERPRET"] = "1"
    argv = [sys.executable, "-X", "importtime", "-c", code]
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    rows = []
    for line in proc.stderr.splitlines():
        parts = line.removeprefix("import time:").split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            rows.append((parts[2].rstrip(), int(parts[1]) / 1e6))
    top = sorted(rows, key=lambda r: -r[1])
    tail = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")][-3:]
    return [(name, round(s, 3)) for name, s in top[:30]] + [(line, 0.0) for line in tail]


def _probe(path: Path, original: str, n: int = 1) -> None:
    """Write ``original`` with the probe line (the ``n``-th change) inserted into the kernel."""
    if PROBE_ANCHOR not in original:
        raise SystemExit(f"{path}: probe anchor {PROBE_ANCHOR.strip()!r} not found")
    head, tail = original.split(PROBE_ANCHOR, 1)
    line_end = tail.index("\n") + 1
    line = PROBE_LINE if n == 1 else PROBE_LINE.replace("changed", f"changed ({n})")
    path.write_text(head + PROBE_ANCHOR + tail[:line_end] + line + tail[line_end:])


def _fastest(records: list[dict[str, Any]]) -> dict[str, Any]:
    good = [r for r in records if "breakdown" in r] or records
    return min(good, key=lambda r: r["process_wall_s"])


def _row(r: dict[str, Any]) -> str:
    b = r.get("breakdown") or {}
    work = b.get("work_s") or {}
    parts = ", ".join(f"{k} {v:.1f}" for k, v in work.items() if v)
    return (
        f"| {r['scenario']} | {b.get('cells_ran', '?')} ran, {b.get('cells_cached', '?')} cached "
        f"| {r['process_wall_s']:.1f} s | {(r.get('timings') or {}).get('wall_s', 0):.1f} s "
        f"| {r['cpu_s']:.1f} s | {len(b.get('lanes') or [])} | {parts or '-'} "
        f"| {100 * float(b.get('harness_share') or 0):.1f}% "
        f"| {r['load_before'][0]:.1f} / {r['load_after'][0]:.1f} |"
    )


def _ratio(probe: str, by: dict[str, dict[str, Any]], repeats: list[dict[str, Any]]) -> list[str]:
    """cold / one-op, nothing-changed, and the bound the changed op's own cell time sets."""
    base = by.get("cold") or by.get("warm")
    if not base or "one-op" not in by:
        return []
    ratio = base["process_wall_s"] / max(by["one-op"]["process_wall_s"], 1e-9)
    nothing = by["nothing"]["process_wall_s"]
    line = f"{base['scenario']} / one-op: {ratio:.1f}x; nothing changed: {nothing:.1f} s"
    if len(repeats) > 1:  # every one-op repeat, each its own change: the spread of the same measurement
        walls = ", ".join(f"{r['process_wall_s']:.1f} s" for r in repeats)
        ratios = ", ".join(f"{base['process_wall_s'] / max(r['process_wall_s'], 1e-9):.1f}x" for r in repeats)
        line += f"; one-op repeats {walls} ({ratios})"
    return ["", line, *_bound(probe, base, by["one-op"])]


def _bound(probe: str, base: dict[str, Any], one: dict[str, Any]) -> list[str]:
    """How fast a one-op run could be at best: the changed op's cell time spread over the lanes."""
    op = Path(probe).parent.name
    cold, changed = (r.get("breakdown") or {} for r in (base, one))
    total = sum((cold.get("by_op_s") or {}).values())
    share = (cold.get("by_op_s") or {}).get(op, 0.0)
    work = (changed.get("by_op_s") or {}).get(op, 0.0)
    lanes = len(changed.get("lanes") or [])
    if not (total and share and work and lanes):
        return []
    best = work / lanes
    pct = 100 * share / total
    ran = changed.get("cells_ran")
    line = (
        f"{op}: {share:.0f} of the {base['scenario']} run's {total:.0f} cell lane-s ({pct:.1f}%); its {ran} "
        f"cells took {work:.0f} lane-s in the one-op run: {best:.1f} s on {lanes} lanes with no harness "
        f"at all, {base['process_wall_s'] / best:.1f}x at best"
    )
    return [line]


def _compiled(records: list[dict[str, Any]]) -> list[str]:
    """Per scenario, the compile caches' new entries: what the run compiled rather than found."""
    said = [
        f"{r['scenario']} {n.get('triton', 0)} Triton, {n.get('inductor', 0)} Inductor"
        for r in records
        if (n := r.get("new_cache_entries")) is not None
    ]
    return ["", "New compile-cache entries (what each run compiled): " + "; ".join(said)] if said else []


def _beside(records: list[dict[str, Any]]) -> list[str]:
    """Work a scenario did on cores its lanes left idle (compiles ahead): not in its capacity."""
    from opgate.validators.breakdown import format_beside

    said = ((r["scenario"], format_beside(r.get("breakdown") or {})) for r in records)
    out = [f"{scenario}, beside the lanes: {text}" for scenario, text in said if text]
    return ["", *out] if out else []


def _summary(
    args: argparse.Namespace, run_args: list[str], records: list[dict[str, Any]], runs: list[dict[str, Any]]
) -> dict[str, Any]:
    """What ``speed.json`` holds: the arguments, the probe, each scenario and every repeat."""
    return {
        "argv": run_args,
        "gap_s": args.gap,
        "probe": f"{args.probe}: {PROBE_LINE.strip()}",
        "cpus": os.cpu_count(),
        "scenarios": records,
        "all_runs": runs,
    }


def _write(out: Path, summary: dict[str, Any]) -> None:
    (out / "speed.json").write_text(json.dumps(summary, indent=1) + "\n")


def _scenarios(
    args: argparse.Namespace, out: Path, run_args: list[str], env: dict[str, str]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """(scenarios, one-op runs, nothing runs); ``speed.json`` is rewritten after each (a cut run keeps it)."""
    records: list[dict[str, Any]] = []
    one: list[dict[str, Any]] = []
    nothing: list[dict[str, Any]] = []

    def save() -> None:
        _write(out, _summary(args, run_args, records, one + nothing))

    if not args.skip_cold:
        records.append(_run("cold", out, run_args, env))
        save()
    records.append(_run("warm", out, [*run_args, "--no-cache"], env))
    save()
    probe = ROOT / args.probe
    original = probe.read_text()
    try:
        for i in range(1, args.repeat + 1):  # each repeat a change of its own (the last one is cached)
            _probe(probe, original, i)
            one.append(_run(f"one-op-{i}", out, run_args, env))
        records.append({**one[0], "scenario": "one-op"})  # the first; the others are said beside it
        save()
    finally:
        probe.write_text(original)
    nothing += [_run(f"nothing-{i}", out, run_args, env) for i in range(1, args.repeat + 1)]
    records.append({**_fastest(nothing), "scenario": "nothing"})
    return records, one, nothing


def _env(caches: Path) -> dict[str, str]:
    """The runs' environment: private build, compile and verdict caches under ``caches``."""
    env = {
        **os.environ,
        "TRITON_CACHE_DIR": str(caches / "triton"),
        "TORCHINDUCTOR_CACHE_DIR": str(caches / "inductor"),
        "OPGATE_BUILD_CACHE": str(caches / "builds"),
        "OPGATE_CACHE": str(caches / "verdicts"),
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("CCACHE_DIR", None)  # the private build cache's ccache, or cold would not be cold
    from opgate.validators import bytecode

    bytecode.apply(env)  # as every `opgate run` does: the import profile then shows what the servers pay
    return env


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--select", action="append", default=[], metavar="GLOB")
    ap.add_argument("--probe", default=PROBE_FILE, help=f"file of the op to change (default {PROBE_FILE})")
    ap.add_argument("--repeat", type=int, default=1, help="one-op runs (each a change) and nothing runs")
    ap.add_argument("--skip-cold", action="store_true", help="keep the caches (a second pass)")
    ap.add_argument(
        "--import-profile", metavar="KIND", help="also profile a fork server's imports (cpu|cuda)"
    )
    ap.add_argument("rest", nargs=argparse.REMAINDER, help="-- then more `opgate run` arguments")
    ap.add_argument("--keep-runs", action="store_true", help="keep every run's cells/, logs/ and work/")
    ap.add_argument("--keep-warm", type=float, metavar="MIN", help="runs reuse warm fork servers")
    ap.add_argument("--gap", type=float, default=0.0, metavar="S", help="seconds between the scenarios")
    args = ap.parse_args()
    global KEEP_RUNS, GAP_S
    KEEP_RUNS, GAP_S = args.keep_runs, args.gap
    out = args.out.resolve()
    caches = out / "cache"
    env = _env(caches)
    run_args = [a for g in args.select for a in ("--select", g)] + [a for a in args.rest if a != "--"]
    if not args.skip_cold:
        shutil.rmtree(caches, ignore_errors=True)
    shutil.rmtree(out / "runs", ignore_errors=True)
    servers = None
    if args.keep_warm:
        # a socket path must stay short (108 bytes): a folder of its own under /tmp, not under --out
        servers = Path(tempfile.mkdtemp(prefix="opgate-speed-", dir="/tmp"))
        env["OPGATE_SERVER_DIR"] = str(servers)
        run_args += ["--keep-warm", f"{args.keep_warm:g}"]
    try:
        records, one, nothing = _scenarios(args, out, run_args, env)
    finally:
        if servers is not None:
            stop = [sys.executable, "-m", "opgate.reports.cli", "servers", "--stop"]
            subprocess.run(stop, cwd=ROOT, env=env, check=False)
            shutil.rmtree(servers, ignore_errors=True)
    summary = _summary(args, run_args, records, one + nothing)
    if args.import_profile:
        summary["preload_profile"] = _preload_profile(env, args.import_profile)
    _write(out, summary)
    by = {r["scenario"]: r for r in records}
    lines = [
        "| scenario | cells | process wall | run wall | CPU | lanes | work (s) | harness | load |",
        "|---|---|---|---|---|---|---|---|---|",
        *(_row(r) for r in records),
    ]
    lines += _ratio(args.probe, by, one)
    lines += _beside(records)
    lines += _compiled([r for r in records if r["scenario"] in ("cold", "warm")] + one + nothing)
    if args.keep_warm:
        lines.append("")
        lines.append(
            f"Fork servers kept warm between the runs (--keep-warm {args.keep_warm:g}): cold started them "
            "and paid their imports, the later runs forked from them.  CPU is the run's own process "
            "tree: workers forked by a warm server are not in it."
        )
    if args.gap:
        lines.append(f"Each run after the first started {args.gap:g} s after the one before ended (--gap).")
    (out / "speed.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if all(r["rc"] in (0, 1) for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
