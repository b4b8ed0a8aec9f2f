"""Result fixtures for the reports tests, built from the real result classes.

Two machines, like a real nightly: a 2-core CPU runner (torch 2.13 CPU build:
CPU cells, ``build`` cells for sm_80/sm_90, GPU runtime cells skipped) and an
H200 (torch 2.11 cu130: sm_90 runtime cells with perf samples).  Records are
made with ``CellResult``/``RunResults`` and written with ``RunResults.write``,
so the files have exactly the shape the validators write.  ``overrides`` plants
faults (a verdict change for one cell); ``slowdown`` plants a perf regression.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from opgate.matrix.cell import Cell
from opgate.reports import compat, diff
from opgate.reports.publish import publish
from opgate.validators.env import env_key
from opgate.validators.result import CellResult, CheckResult, RunResults, Verdict


def _fp(**fields: Any) -> dict[str, Any]:
    fp: dict[str, Any] = {
        "fingerprint_version": 1,
        "cudnn": None,
        "cxx11abi": True,
        "nvcc": {},
        "driver": None,
        "gpus": [],
    }
    fp.update(fields)
    fp["env_key"] = env_key(fp)
    return fp


CPU_ENV = _fp(
    torch="2.13.0+cpu", triton="3.8.0", cuda_runtime=None, gpu_name=None, gpu_capability=None,
    python="3.11.9", platform="Linux-x86_64", machine="x86_64", cpu_count=2, hostname_hash="a1b2c3d4e5f6",
)  # fmt: skip
H200_ENV = _fp(
    torch="2.11.0+cu130", triton="3.6.0", cuda_runtime="13.0", gpu_name="NVIDIA H200", gpu_capability="9.0",
    driver="580.82", python="3.12.3", platform="Linux-x86_64", machine="x86_64", cpu_count=16,
    hostname_hash="0f9e8d7c6b5a",
    gpus=[{"index": 0, "name": "NVIDIA H200", "capability": "9.0", "memory_gib": 139.8, "sms": 132}],
)  # fmt: skip

DTYPES = ("fp32", "fp16", "bf16")
LAYOUTS = ("contiguous", "transposed", "strided")
MODES = ("eager", "compile")
#: A reason with markup: the dashboard must show it as text, and it must not end the data block.
HOSTILE_REASON = (
    "correctness: max err 3.1e-01 > 2.0 x ref 1.6e-03 </script><script>window.__pwned=1</script> <!--"
)
FAIL_CELL = "rms_norm.triton-pt2.13-cpu-fp16-strided-eager"
FALLBACK_CELL = "rms_norm.triton-pt2.13-cpu-bf16-transposed-compile"
ERROR_CELL = "silu_mul.triton-pt2.13-cpu-bf16-contiguous-compile"
UNSUPPORTED_CELL = "silu_mul.triton-pt2.13-cpu-fp16-zero_size-eager"
PERF_CELL = "rms_norm.triton-pt2.11-cu13.0-sm_90-bf16-contiguous-eager"
#: do_bench medians measured on the H200 (h200-measurements.md), microseconds, and bytes moved.
PERF_SHAPES = {(4096, 4096): (27.0, 2 * 4096 * 4096 * 2), (32768, 8192): (262.0, 2 * 32768 * 8192 * 2)}
COPY_GBPS = 4274.0


def repro(cell_id: str, seed: int | None) -> str:
    seed_part = f" --seed {seed}" if seed is not None else ""
    return f"opgate run --select '{cell_id}'{seed_part} --out /tmp/opgate-repro"


def _checks(cell: Cell, verdict: Verdict, reason: str) -> tuple[list[CheckResult], list[str]]:
    """Checks and kernel names consistent with a verdict (what the validators record)."""
    own = f"_{cell.op}_fwd_kernel" if cell.arch != "cpu" else f"opgate::{cell.op}"
    ok = CheckResult(
        "correctness", Verdict.PASS, "max err 1.2e-03 <= 2.0 x ref 9.8e-04", {"max_abs_err": 1.2e-3}
    )
    decomposed = ["triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0"]
    if cell.mode == "build":
        binary = CheckResult(
            "binary", verdict, f"cuobjdump: SASS for {cell.arch}", {"elf": [f"k.{cell.arch}.cubin"]}
        )
        return ([binary] if verdict is not Verdict.SKIP else []), []
    by_verdict: dict[Verdict, tuple[list[CheckResult], list[str]]] = {
        Verdict.PASS: ([ok, CheckResult("evidence", Verdict.PASS, f"saw {own}", {"seen": [own]})], [own]),
        Verdict.FALLBACK: (
            [ok, CheckResult("evidence", Verdict.FALLBACK, f"expected {own} not seen", {"seen": decomposed})],
            decomposed,
        ),
        Verdict.FAIL: (
            [
                CheckResult(
                    "correctness",
                    Verdict.FAIL,
                    reason,
                    {"max_abs_err": 0.31, "ref_err": 1.6e-3, "error": reason},
                )
            ],
            [own],
        ),
        Verdict.ERROR: (
            [CheckResult("worker", Verdict.ERROR, reason, {"signal": "SIGSEGV", "error": reason})],
            [],
        ),
        Verdict.UNSUPPORTED: (
            [CheckResult("declared_limits", Verdict.UNSUPPORTED, reason, {"raised": "NotImplementedError"})],
            [],
        ),
    }
    return by_verdict.get(verdict, ([], []))


def perf_check(slowdown: float, seed: int, samples: int = 40) -> CheckResult:
    """A perf check as validators/perf records it: per-repetition samples.

    Noise model of a shared GPU: each run drifts as a whole (clocks, neighbours:
    1% run-to-run), and repetitions scatter 1.5% around the run's centre.  The
    run-level drift is what makes a bare significance test raise false alarms.
    """
    rng = random.Random(seed)
    drift = 1.0 + rng.gauss(0.0, 0.01)
    points = []
    for shape, (med_us, nbytes) in PERF_SHAPES.items():
        center = med_us * slowdown * drift
        times = sorted(center * (1.0 + rng.gauss(0.0, 0.015)) for _ in range(samples))
        median_us = times[len(times) // 2]
        gbps = nbytes / (median_us * 1e-6) / 1e9
        points.append(
            {
                "shape": list(shape),
                "median_us": median_us,
                "iqr_us": times[3 * samples // 4] - times[samples // 4],
                "samples_us": times,
                "gbps": gbps,
                "roofline_pct": 100.0 * gbps / COPY_GBPS,
                "baseline": {"name": "aten", "gbps": 2690.0},
            }
        )
    return CheckResult(
        "perf", Verdict.PASS, "measured", {"points": points, "ceilings": {"copy_gbps": COPY_GBPS}}
    )


def _result(
    cell: Cell, verdict: Verdict, env: Mapping[str, Any], reason: str = "", seed: int = 1234
) -> CellResult:
    checks, kernels = _checks(cell, verdict, reason)
    ran = verdict is not Verdict.SKIP
    return CellResult(
        cell=cell,
        verdict=verdict,
        env=dict(env),
        checks=checks,
        kernels=kernels,
        duration_s=1.5 if ran else 0.0,
        reason=reason if verdict is not Verdict.PASS else "",
        seed=seed if ran else None,
        repro=repro(cell.id, seed if ran else None),
    )


def cpu_run(overrides: Mapping[str, tuple[Verdict, str]] | None = None, shard: str = "cpu-0") -> RunResults:
    """The CPU runner's results; ``overrides`` maps cell id -> (verdict, reason)."""
    planted: dict[str, tuple[Verdict, str]] = {
        FAIL_CELL: (Verdict.FAIL, HOSTILE_REASON),
        FALLBACK_CELL: (
            Verdict.FALLBACK,
            "evidence: expected opgate::rms_norm not seen (Inductor decomposed it)",
        ),
        ERROR_CELL: (Verdict.ERROR, "worker killed by SIGSEGV"),
        UNSUPPORTED_CELL: (
            Verdict.UNSUPPORTED,
            "raised NotImplementedError: zero-size inputs are not supported",
        ),
    }
    planted.update(overrides or {})
    cells: list[CellResult] = []
    torch = str(CPU_ENV["torch"])
    for op in ("rms_norm", "silu_mul"):
        for dtype in DTYPES:
            for layout in (*LAYOUTS, "zero_size") if op == "silu_mul" else LAYOUTS:
                for mode in MODES:
                    cell = Cell(op, "triton", torch, "none", "cpu", dtype, layout, mode)
                    verdict, reason = planted.get(cell.id, (Verdict.PASS, ""))
                    cells.append(_result(cell, verdict, CPU_ENV, reason))
        for arch in ("sm_80", "sm_90"):
            build = Cell(op, "triton", torch, "13.0", arch, "all", "all", "build")
            verdict, reason = planted.get(build.id, (Verdict.PASS, ""))
            cells.append(_result(build, verdict, CPU_ENV, reason))
            for mode in MODES:
                cell = Cell(op, "triton", torch, "13.0", arch, "fp32", "contiguous", mode)
                verdict, reason = planted.get(cell.id, (Verdict.SKIP, f"no {arch} device here"))
                cells.append(_result(cell, verdict, CPU_ENV, reason))
    return RunResults(cells, dict(CPU_ENV), "2026-11-30T10:00:00Z", "2026-11-30T10:07:00Z", ["run"], shard)


def gpu_run(
    slowdown: float = 1.0,
    seed: int = 0,
    overrides: Mapping[str, tuple[Verdict, str]] | None = None,
    shard: str = "sm90-0",
) -> RunResults:
    """The H200's results; bf16 contiguous eager carries perf samples (``slowdown`` scales them)."""
    cells: list[CellResult] = []
    torch = str(H200_ENV["torch"])
    for dtype in DTYPES:
        for layout in ("contiguous", "transposed"):
            for mode in MODES:
                cell = Cell("rms_norm", "triton", torch, "13.0", "sm_90", dtype, layout, mode)
                verdict, reason = (overrides or {}).get(cell.id, (Verdict.PASS, ""))
                result = _result(cell, verdict, H200_ENV, reason)
                if cell.id == PERF_CELL:
                    result.checks.append(perf_check(slowdown, seed))
                cells.append(result)
    build = Cell("rms_norm", "triton", torch, "13.0", "sm_90", "all", "all", "build")
    cells.append(_result(build, Verdict.PASS, H200_ENV))
    return RunResults(cells, dict(H200_ENV), "2026-11-30T11:00:00Z", "2026-11-30T11:04:00Z", ["run"], shard)


def write_run(run: RunResults, directory: Path) -> Path:
    """Write ``directory/results.json`` the way the validators do; return the folder."""
    run.write(directory / "results.json")
    return directory


NEW_FAILURE = "rms_norm.triton-pt2.13-cpu-fp32-contiguous-eager"
NEW_FALLBACK = "rms_norm.triton-pt2.13-cpu-fp32-contiguous-compile"
LOST_BUILD = "rms_norm.triton-pt2.13-cu13.0-sm_80-all-all-build"
#: The head run's planted changes: a new failure, a new fallback, a fix, lost coverage.
HEAD_OVERRIDES: dict[str, tuple[Verdict, str]] = {
    NEW_FAILURE: (Verdict.FAIL, "correctness: max err 4.0e-02 > 2.0 x ref 9.8e-04"),
    NEW_FALLBACK: (Verdict.FALLBACK, "evidence: expected opgate::rms_norm not seen"),
    FAIL_CELL: (Verdict.PASS, ""),
    LOST_BUILD: (Verdict.SKIP, "nvcc 13.0 not found"),
}


def publish_pair(root: Path, slowdown: float = 1.10) -> tuple[Path, Path]:
    """Publish a base and a head (planted regressions + a perf slowdown); return both compat.json."""
    base_in = [write_run(cpu_run(), root / "in" / "base-cpu"), write_run(gpu_run(), root / "in" / "base-gpu")]
    head_in = [
        write_run(cpu_run(HEAD_OVERRIDES), root / "in" / "head-cpu"),
        write_run(gpu_run(slowdown=slowdown, seed=7), root / "in" / "head-gpu"),
    ]
    publish(base_in, root / "base")
    publish(head_in, root / "head", history=root / "base" / "compat.json")
    return root / "base" / "compat.json", root / "head" / "compat.json"


def regression_diff(root: Path) -> dict[str, Any]:
    """The JSON diff between :func:`publish_pair`'s base and head, as ``reports diff`` writes it."""
    base, head = publish_pair(root)
    text = diff.dumps(diff.compute(compat.load(base), compat.load(head), str(base), str(head)))
    (root / "diff.json").write_text(text)
    result: dict[str, Any] = json.loads(text)
    return result
