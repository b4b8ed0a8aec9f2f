"""The op inventory: one row per op from the specs and the committed benchmarks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parent.parent


BENCH = sorted((REPO / "results" / "runs" / "h200-bench").glob("*.json"))


def inventory(*args: str) -> subprocess.CompletedProcess[str]:
    bench = [a for f in BENCH for a in ("--bench", str(f))]
    return subprocess.run([sys.executable, "-m", "opgate.reports", "inventory", *bench, *args],
                          cwd=REPO, capture_output=True, text=True, check=False)  # fmt: skip


def test_inventory_rows_from_specs_and_h200_benchmarks() -> None:
    # the converted H200 runs measured the copy ceiling but not the GEMM one: the flag fills it in
    proc = inventory("--gemm-tflops", "686.5")
    assert proc.returncode == 0, proc.stderr
    assert "4275 GB/s copy" in proc.stdout, "the copy ceiling is the one the benchmark run measured"
    rows = {ln.split(" | ")[0].strip("| "): ln for ln in proc.stdout.splitlines() if ln.startswith("| ")}
    assert "memory" in rows["rms_norm"]  # 1 FLOP/byte, far below the ridge
    assert "% of copy" in rows["rms_norm"]  # measured on the H200
    assert "compute" in rows["matmul"]  # 8192^3 GEMM: thousands of FLOP/byte
    assert rows["matmul"].split(" | ")[5] == "–"  # no opgate benchmark for a library op
    assert rows["fused_add_rms_norm"].rstrip(" |").endswith("yes")
    assert rows["rms_norm"].rstrip(" |").endswith("no")
    assert "cuda (cuda), triton (triton)" in rows["silu_mul"]


def test_without_measured_ceilings_no_gpu_is_assumed() -> None:
    proc = inventory()
    assert proc.returncode == 0, proc.stderr
    assert "No measured ceilings" in proc.stdout
    rows = {ln.split(" | ")[0].strip("| "): ln for ln in proc.stdout.splitlines() if ln.startswith("| ")}
    assert "1.0 FLOP/B (no ceilings)" in rows["rms_norm"]
    assert "memory" not in rows["rms_norm"]
