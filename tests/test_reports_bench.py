"""The one benchmark renderer shows what was measured, misses included; the converter keeps every verdict."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from opgate.reports import bench_legacy, bench_table
from opgate.validators.perf.report import BENCH_FORMAT

REPO = Path(__file__).resolve().parent.parent
COMMITTED = sorted((REPO / "results" / "runs" / "h200-bench").glob("*.json"))
LEGACY = REPO / "tests" / "data" / "bench" / "legacy_rms_norm.json"


def _result(role: str, us: float, pct: float | None) -> dict[str, Any]:
    return {"role": role, "median_us": us, "iqr_us": 0.1, "n": 20, "gbps": None, "pct_copy": pct}


def _doc() -> dict[str, Any]:
    """A bench.json as ``opgate perf bench`` writes it (validators.perf.bench.time_case records)."""

    def case(
        label: str, direction: str, results: dict[str, Any], errors: dict[str, str] | None = None
    ) -> Any:
        shape = [int(d) for d in label.split("x")]
        return {"op": "rms_norm", "shape": shape, "label": label, "dtype": "bf16", "direction": direction,
                "context": None, "bytes": 1, "results": results, "errors": errors or {}}  # fmt: skip

    return {
        "format": BENCH_FORMAT,
        "info": {
            "device": "NVIDIA H200",
            "capability": "9.0",
            "torch": "2.11.0",
            "triton": "3.6.0",
            "date": "2026-11-30T05:39:58+00:00",
        },
        "ceilings": {"copy_gbps": 4274.0, "gemm_tflops": 686.0},
        "timing": {"method": "CUDA-event medians"},
        "cases": [
            case(
                "32768x8192",
                "forward",
                {"opgate-triton": _result("opgate", 265.2, 94.7), "liger": _result("peer", 268.3, 93.7)},
            ),
            case(
                "8x4096",
                "forward",
                {
                    "opgate-triton": _result("opgate", 67.4, 0.05),
                    "opgate-triton-compiled": _result("variant", 5.0, 0.6),
                    "aten": _result("peer", 11.1, 0.3),
                },
                {"liger": "NotImplementedError: no such layout"},
            ),
        ],
        "unavailable": {"rms_norm": {"opgate-cuda": "CudaBuildUnsupported: CPU-only torch"}},
        "wall_s": 1.0,
    }


def test_table_bolds_the_fastest_and_states_the_gap(tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(_doc()))
    text = bench_table.render(bench_table.load([path]))
    small = next(ln for ln in text.splitlines() if ln.startswith("| 8x4096"))
    assert "**5.0 us (1%)**" in small, "the fastest of the row is bold, a variant included"
    assert small.endswith("| 507% slower |"), "but the verdict is opgate's own kernels against the peers"
    big = next(ln for ln in text.splitlines() if ln.startswith("| 32768x8192"))
    assert "**265.2 us (95%)**" in big
    assert big.endswith("| fastest |")
    assert text.index("| 8x4096") < text.index("| 32768x8192"), "rows by size"
    assert "NVIDIA H200 (sm_90), torch 2.11.0, triton 3.6.0, 2026-11-30; copy ceiling 4274 GB/s" in text
    assert "- not timed: liger 8x4096 fwd: NotImplementedError: no such layout" in text
    assert "- left out: opgate-cuda: CudaBuildUnsupported" in text


def test_roles_come_from_the_data_not_the_names() -> None:
    results = {"opgate-triton": _result("peer", 5.0, None), "aten": _result("opgate", 10.0, None)}
    assert bench_table.verdict(results) == "100% slower"


@pytest.mark.integration
def test_cli_renders_and_rejects_foreign_json(tmp_path: Path) -> None:
    good, bad, old = tmp_path / "good.json", tmp_path / "bad.json", tmp_path / "old.json"
    good.write_text(json.dumps(_doc()))
    bad.write_text(json.dumps({**_doc(), "cases": [{"op": "x"}]}))
    old.write_text(LEGACY.read_text())
    out = tmp_path / "bench.md"
    ok = subprocess.run([sys.executable, "-m", "opgate.reports", "bench", "--in", str(good),
                         "--out", str(out)],
                        cwd=REPO, capture_output=True, text=True, check=False)  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert "### rms_norm" in out.read_text()
    for path, why in ((bad, "cases[0] lacks"), (old, "format is None")):
        refused = subprocess.run([sys.executable, "-m", "opgate.reports", "bench", "--in", str(path)],
                                 cwd=REPO, capture_output=True, text=True, check=False)  # fmt: skip
        assert refused.returncode == 7
        assert f"{path}: not a benchmark document (opgate.bench/1): {why}" in refused.stderr
        assert "Traceback" not in refused.stderr


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.stem)
def test_committed_h200_benchmarks_are_in_the_one_format_and_render(path: Path) -> None:
    docs = bench_table.load([path])
    text = bench_table.render(docs)
    assert f"### {path.stem}" in text
    assert "NVIDIA H200 (sm_90)" in text


def test_committed_results_are_the_converter_output_of_the_old_files() -> None:
    """The legacy rms_norm file converts to exactly the committed one (so all five were converted so)."""
    converted = bench_legacy.convert(json.loads(LEGACY.read_text()))
    committed = json.loads((REPO / "results" / "runs" / "h200-bench" / "rms_norm.json").read_text())
    assert converted == committed


def _legacy_verdicts(doc: dict[str, Any]) -> dict[tuple[str, str, str], str]:
    """The old table's rule, re-stated on the old rows: opgate's kernels (not compiled) vs the rest."""
    groups: dict[tuple[str, str, str], dict[str, float]] = {}
    for row in doc["rows"]:
        if row["direction"] in ("fwd", "bwd") and isinstance(row.get("us"), float):
            groups.setdefault((row["shape"], row["dtype"], row["direction"]), {})[row["impl"]] = row["us"]
    out = {}
    for key, times in groups.items():
        ours = [t for i, t in times.items() if i.startswith("opgate") and "compiled" not in i]
        peers = [t for i, t in times.items() if not i.startswith("opgate")]
        ratio = min(ours) / min(peers)
        out[key] = "fastest" if ratio <= 1.0 else f"{100 * (ratio - 1):.0f}% slower"
    return out


def _table_rows(text: str) -> dict[tuple[str, ...], str]:
    """Data rows of rendered tables by (shape, dtype, dir)."""
    rows = [ln for ln in text.splitlines() if ln.startswith("| ") and not ln.startswith(("| shape", "|---"))]
    return {tuple(c.strip() for c in ln.strip("|").split("|")[:3]): ln for ln in rows}


def test_conversion_keeps_every_verdict_and_every_figure() -> None:
    old = json.loads(LEGACY.read_text())
    rows = _table_rows(bench_table.render([bench_legacy.convert(old)]))
    expected = _legacy_verdicts(old)
    assert len(rows) == len(expected) >= 8
    for key, verdict in expected.items():
        assert rows[key].rstrip(" |").endswith(verdict), (key, rows[key])
    for row in old["rows"]:
        if row["direction"] in ("fwd", "bwd") and isinstance(row.get("us"), float):
            figure = f"{row['us']:.1f} us ({row['pct_copy']:.0f}%)"
            assert figure in rows[(row["shape"], row["dtype"], row["direction"])]


@pytest.mark.integration
def test_converter_command_writes_one_file_per_input(tmp_path: Path) -> None:
    convert = [sys.executable, "-m", "opgate.reports.bench_legacy"]
    proc = subprocess.run([*convert, str(LEGACY), "--out", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert bench_table.load([tmp_path / LEGACY.name])[0]["format"] == BENCH_FORMAT
    bad = tmp_path / "new.json"
    bad.write_text(json.dumps(_doc()))
    refused = subprocess.run([*convert, str(bad), "--out", str(tmp_path)],
                             cwd=REPO, capture_output=True, text=True, check=False)  # fmt: skip
    assert refused.returncode == 7
    assert "not a per-op benchmark document" in refused.stderr


@pytest.mark.integration
def test_publish_with_bench_puts_the_table_in_the_release_notes(tmp_path: Path) -> None:
    bench = tmp_path / "bench.json"
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
