"""The op inventory: one row per op from the specs and the committed benchmarks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_inventory_rows_from_specs_and_h200_benchmarks() -> None:
    bench = sorted((REPO / "reports" / "runs" / "h200-bench").glob("*.json"))
    args = [a for f in bench for a in ("--bench", str(f))]
    proc = subprocess.run([sys.executable, "-m", "opgate.reports", "inventory", *args],
                          cwd=REPO, capture_output=True, text=True, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rows = {ln.split(" | ")[0].strip("| "): ln for ln in proc.stdout.splitlines() if ln.startswith("| ")}
    assert "memory" in rows["rms_norm"]  # 1 FLOP/byte, far below the ridge
    assert "% of copy" in rows["rms_norm"]  # measured on the H200
    assert "compute" in rows["matmul"]  # 8192^3 GEMM: thousands of FLOP/byte
    assert rows["matmul"].split(" | ")[5] == "–"  # no opgate benchmark for a library op
    assert rows["fused_add_rms_norm"].rstrip(" |").endswith("yes")
    assert rows["rms_norm"].rstrip(" |").endswith("no")
    assert "cuda (cuda), triton (triton)" in rows["silu_mul"]
