"""The published benchmark table renders what was measured, misses included."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from opgate.reports import bench_table

REPO = Path(__file__).resolve().parent.parent


def _doc() -> dict[str, object]:
    meta = {"device": "NVIDIA H200", "capability": "sm_90", "torch": "2.11.0", "triton": "3.6.0",
            "date": "2026-11-30T05:39:58+00:00", "copy_gbps": 4274.0, "method": "median"}  # fmt: skip

    def row(shape: str, impl: str, direction: str, us: float, pct: float) -> dict[str, object]:
        return {"op": "rms_norm", "shape": shape, "dtype": "bf16", "impl": impl,
                "direction": direction, "us": us, "pct_copy": pct}  # fmt: skip

    rows = [
        row("32768x8192", "opgate triton", "fwd", 265.2, 94.7),
        row("32768x8192", "liger", "fwd", 268.3, 93.7),
        row("8x4096", "opgate triton", "fwd", 67.4, 0.05),
        row("8x4096", "aten F.rms_norm", "fwd", 11.1, 0.3),
        row("8x4096", "opgate triton", "host-fwd", 60.0, 0.0),
    ]
    return {"meta": meta, "op": "rms_norm", "rows": rows}


def test_table_bolds_the_fastest_and_states_the_gap(tmp_path: Path) -> None:
    path = tmp_path / "rms_norm.json"
    path.write_text(json.dumps(_doc()))
    text = bench_table.render(bench_table.load([path]))
    lines = {ln.split(" | ")[0].strip("| "): ln for ln in text.splitlines() if ln.startswith("| 8x4096")}
    assert "**11.1 us (0%)**" in lines["8x4096"]
    assert "507% slower" in lines["8x4096"]
    big = next(ln for ln in text.splitlines() if ln.startswith("| 32768x8192"))
    assert "**265.2 us (95%)**" in big
    assert big.endswith("| fastest |")
    assert "host-fwd" not in text  # host-side rows are not kernel timings
    assert "NVIDIA H200 (sm_90), torch 2.11.0" in text


def test_cli_renders_and_rejects_foreign_json(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(_doc()))
    bad.write_text(json.dumps({"rows": []}))
    out = tmp_path / "bench.md"
    ok = subprocess.run([sys.executable, "-m", "opgate.reports", "bench", "--in", str(good),
                         "--out", str(out)],
                        cwd=REPO, capture_output=True, text=True, check=False)  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert "### rms_norm" in out.read_text()
    refused = subprocess.run([sys.executable, "-m", "opgate.reports", "bench", "--in", str(bad)],
                             cwd=REPO, capture_output=True, text=True, check=False)  # fmt: skip
    assert refused.returncode == 7
    assert "not a benchmark document" in refused.stderr


@pytest.mark.parametrize("name", ["rms_norm", "silu_mul", "layer_norm", "rope", "fused_add_rms_norm"])
def test_committed_h200_benchmarks_render(name: str) -> None:
    text = bench_table.render(bench_table.load([REPO / "reports" / "runs" / "h200-bench" / f"{name}.json"]))
    assert f"### {name}" in text
    assert "NVIDIA H200" in text


def test_publish_with_bench_puts_the_table_in_the_release_notes(tmp_path: Path) -> None:
    bench = tmp_path / "rms_norm.json"
    bench.write_text(json.dumps(_doc()))
    run = REPO / "tests" / "data" / "reports" / "validators-cpu"
    out = tmp_path / "out"
    argv = ["-m", "opgate.reports", "publish", "--in", str(run), "--out", str(out), "--bench", str(bench)]
    proc = subprocess.run([sys.executable, *argv], cwd=REPO, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    notes = (out / "compat.md").read_text()
    assert "## Benchmarks" in notes
    assert "**265.2 us (95%)**" in notes
    assert (out / "bench.md").read_text().startswith("# opgate benchmark table")
