"""The per-cell perf check (validators.checks.perf): nothing on CPU, a fixed record format on GPU."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from opgate.matrix.cell import Cell
from opgate.matrix.spec import load_specs, resolve
from opgate.validators.checks import perf
from opgate.validators.checks.artifacts import Artifact
from opgate.validators.checks.base import run_check
from opgate.validators.checks.context import CellContext
from opgate.validators.perf.timing import Timing
from opgate.validators.result import Verdict
from opgate.validators.tolerance import Rule


def _ctx(
    tmp_path: Path, *, device: str = "cpu", mode: str = "eager", layout: str = "contiguous"
) -> CellContext:
    """A context for rms_norm whose 'op' is the reference (nothing here may run a kernel)."""
    spec = load_specs()["rms_norm"]
    arch = "cpu" if device == "cpu" else "sm_90"
    cell = Cell(
        "rms_norm", "triton", "2.13.0", "none" if arch == "cpu" else "13.0", arch, "bf16", layout, mode
    )
    ref = resolve(spec.reference)
    return CellContext(
        cell=cell, spec=spec, impl=spec.implementations["triton"], device=device, seed=0, workdir=tmp_path,
        op=ref, reference=ref, sample_fn=resolve(spec.samples), dtype=torch.bfloat16,
        shapes=list(spec.shapes["default"]), rule=Rule(2.0, 1e-5), copies_allowed=0,
    )  # fmt: skip


def test_cpu_cell_is_skipped_and_records_nothing(tmp_path: Path) -> None:
    for check in perf.CHECKS:
        result = run_check(check, _ctx(tmp_path))
        assert result.status is Verdict.SKIP
        assert result.summary == "perf is measured on GPUs only"
        assert result.details == {}
    direct = perf.run(_ctx(tmp_path, mode="compile"))  # called without the guard: still nothing timed
    assert (direct.status, direct.summary, direct.details) == (Verdict.SKIP, perf.CPU_REASON, {})
    assert not (tmp_path.parent / perf.CEILINGS_FILE).exists()


@pytest.mark.parametrize(
    ("mode", "layout", "reason"),
    [
        ("export", "contiguous", "not export"),
        ("aoti", "contiguous", "not aoti"),
        ("eager", "zero_size", "nothing to time"),
    ],
)
def test_gpu_cells_outside_the_timed_modes_are_skipped(
    tmp_path: Path, mode: str, layout: str, reason: str
) -> None:
    ctx = _ctx(tmp_path, device="cuda:0", mode=mode, layout=layout)
    assert reason in (perf.applies(ctx) or "")
    assert perf.applies(_ctx(tmp_path, device="cuda:0")) is None
    assert perf.applies(_ctx(tmp_path, device="cuda:0", mode="cudagraphs")) is None  # worth-it is timed there


def test_failed_artifact_is_not_timed(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path, device="cuda:0", mode="compile")
    ctx.artifact = Artifact(ctx.op)
    ctx.artifact.failure = "graph break"
    assert "graph break" in (perf.applies(ctx) or "")


def test_shape_record_has_the_documented_format() -> None:
    op = Timing("op", [10.0, 11.0, 12.0, 13.0, 100.0])
    base = Timing("baseline", [20.0, 22.0, 24.0])
    record = perf.shape_record(
        (4096, 4096), op, base, "reference", cost=(2 * 4096 * 4096 * 2.0, 4.0 * 4096 * 4096),
        ceilings={"copy_gbps": 4000.0, "gemm_tflops": 800.0},
    )  # fmt: skip
    assert list(record) == [
        "shape", "samples_us", "median_us", "iqr_us", "bytes", "flops", "gbps", "pct_copy",
        "tflops", "pct_gemm", "baseline",
    ]  # fmt: skip
    assert record["shape"] == [4096, 4096]
    assert record["median_us"] == 12.0
    assert record["iqr_us"] == 2.0
    assert record["samples_us"] == op.samples_us
    gbps = 2 * 4096 * 4096 * 2 / 12e-6 / 1e9
    assert record["gbps"] == pytest.approx(gbps, abs=0.01)
    assert record["pct_copy"] == pytest.approx(100 * gbps / 4000, abs=0.01)
    assert record["tflops"] == pytest.approx(4 * 4096 * 4096 / 12e-6 / 1e12, abs=1e-3)
    assert record["baseline"] == {"name": "reference", "median_us": 22.0, "samples_us": [20.0, 22.0, 24.0]}
    none = perf.shape_record(
        (8,), op, base, "reference", cost=(None, None), ceilings={"copy_gbps": 1, "gemm_tflops": 1}
    )
    assert none["gbps"] is none["pct_copy"] is none["tflops"] is none["pct_gemm"] is None


def test_summary_names_the_largest_shape() -> None:
    small = {"shape": [8, 4096], "bytes": 10.0, "median_us": 9.0, "gbps": 1.0, "pct_copy": 0.1,
             "baseline": {"name": "reference", "median_us": 18.0}}  # fmt: skip
    big = {"shape": [4096, 4096], "bytes": 1e8, "median_us": 40.0, "gbps": 2500.0, "pct_copy": 60.0,
           "baseline": {"name": "reference", "median_us": 120.0}}  # fmt: skip
    assert perf.summarize([small, big]) == "4096x4096: 40.0 us, 2500 GB/s (60% of copy), 3.00x reference"


def test_timing_runs_with_poisoning_off_and_restores_it() -> None:
    from opgate.validators.checks.cell import poisoned_allocations

    with poisoned_allocations():
        assert torch.empty(64).isnan().all()
        with perf.honest_allocations():
            assert not torch.are_deterministic_algorithms_enabled()
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.empty(64).isnan().all()
    assert dataclasses.is_dataclass(perf.CHECKS[0])


@pytest.mark.integration
def test_compile_cells_use_the_eager_reference_unless_overridden(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path, device="cuda:0", mode="compile")
    assert perf._callables(ctx)[2] == "reference"
    cell = dataclasses.replace(ctx.cell, overrides=(("perf_baseline", "compile"),))
    assert perf._callables(dataclasses.replace(ctx, cell=cell))[2] == "compile(reference)"


class _HostEvent:
    def __init__(self, enable_timing: bool = False) -> None:
        self.t = 0.0

    def record(self) -> None:
        import time

        self.t = time.perf_counter()

    def elapsed_time(self, end: _HostEvent) -> float:
        return (end.t - self.t) * 1000.0


@pytest.mark.integration
def test_run_path_end_to_end_with_host_clock_events(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU path of run() with CUDA stood in for: every shape timed, the record complete."""
    import types

    from opgate.validators.perf import ceilings, timing

    props = types.SimpleNamespace(name="Fake GPU", L2_cache_size=1 << 20, uuid="fake")
    monkeypatch.setattr(torch.cuda, "Event", _HostEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a, **k: props)
    monkeypatch.setattr(timing, "L2_FLUSH_BYTES", 4096)
    monkeypatch.setattr(
        timing, "CHECK_TIMING", timing.TimingConfig(warmup_ms=0.1, rep_ms=1.0, min_reps=5, max_reps=5)
    )
    fixed = ceilings.Ceilings("Fake GPU", "fake", 4000.0, 800.0, 1, 1, 1.0, 1.0)
    monkeypatch.setattr(ceilings, "get", lambda index, cache_file=None: fixed)
    monkeypatch.setattr(perf, "applies", lambda ctx: None)  # the cell is on "cpu"; pretend it is a GPU
    ctx = _ctx(tmp_path)
    result = perf.run(ctx)
    assert result.status is Verdict.PASS, result.details
    details = result.details
    assert list(details) == ["shapes", "worth_it", "ceilings", "clocks", "device"], details.get("errors")
    worth = details["worth_it"]
    assert worth["baselines"] == ["reference", "aten", "compile(reference)"]
    assert [(r["shape"], r["direction"]) for r in worth["rows"]] == [
        (list(s), d) for s in ctx.shapes for d in ("forward", "forward+backward")
    ]
    assert all(r["finding"] in ("slower", "par", "faster") for r in worth["rows"])
    assert worth["summary"]["finding"] in ("slower", "par", "faster")
    assert "worth it? eager: " in result.summary
    assert details["ceilings"] == {"copy_gbps": 4000.0, "gemm_tflops": 800.0}
    assert details["device"] == "Fake GPU"
    assert [s["shape"] for s in details["shapes"]] == [list(s) for s in ctx.shapes]
    for record in details["shapes"]:
        assert len(record["samples_us"]) == len(record["baseline"]["samples_us"]) == 5
        m, n = record["shape"]
        assert record["rotated_copies"] == timing.rotation_count(2 * m * n + 2 * n, 1 << 20) > 1
        assert record["bytes"] == 2 * record["shape"][0] * record["shape"][1] * 2 + record["shape"][1] * 2
    assert "us" in result.summary


def test_every_timed_mode_runs_the_perf_check() -> None:
    """The worth-it verdict needs the perf check in each mode it is defined for (cudagraphs too)."""
    from opgate.validators.checks.cell import MODE_CHECKS

    assert all("perf" in MODE_CHECKS[mode] for mode in perf.MODES)
