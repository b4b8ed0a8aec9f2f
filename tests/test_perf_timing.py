"""Timing logic (validators.perf.timing) on CPU: schedules, rotation sizing, clocks, and the timing
loop itself driven by host-clock stand-ins for CUDA events."""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from opgate.validators.perf import timing
from opgate.validators.perf.timing import (
    Rotating,
    TimingConfig,
    ab_schedule,
    parse_clocks,
    read_clocks,
    rep_count,
    rotation_count,
    time_interleaved,
)

L2 = 50 * 2**20


def test_ab_schedule_alternates_order_and_balances_positions() -> None:
    order = ab_schedule(["a", "b"], 4)
    assert order == ["a", "b", "b", "a", "a", "b", "b", "a"]
    three = ab_schedule(["a", "b", "c"], 6)
    rounds = [three[i : i + 3] for i in range(0, 18, 3)]
    assert all(sorted(r) == ["a", "b", "c"] for r in rounds)
    assert sum(r[0] == "a" for r in rounds) == sum(r[0] == "c" for r in rounds) == 3
    with pytest.raises(ValueError, match="duplicate"):
        ab_schedule(["a", "a"], 1)


def test_rotation_count_covers_twice_l2_for_small_inputs_only() -> None:
    assert rotation_count(300 * 2**20, L2) == 1  # big inputs cannot stay in L2
    assert rotation_count(2 * L2, L2) == 1
    assert rotation_count(30 * 2**20, L2) == 4  # 4 x 30 MiB >= 100 MiB
    assert rotation_count(64 * 2**10, L2) == timing.MAX_ROTATIONS  # tiny: capped (the flush does the rest)
    assert rotation_count(0, L2) == 1
    assert rotation_count(1024, 0) == 1


def test_rep_count_clamps_to_config() -> None:
    cfg = TimingConfig(rep_ms=100.0, min_reps=20, max_reps=400)
    assert rep_count(1000.0, 100.0, cfg) == 100
    assert rep_count(1.0, 100.0, cfg) == 400
    assert rep_count(50_000.0, 100.0, cfg) == 20
    assert rep_count(0.0, 100.0, cfg) == 400
    with pytest.raises(ValueError, match="min_reps"):
        TimingConfig(min_reps=10, max_reps=5)
    with pytest.raises(ValueError, match="rep_ms"):
        TimingConfig(rep_ms=0.0)


def test_rotating_cycles_argument_sets() -> None:
    seen: list[int] = []
    fn = Rotating(lambda i, scale=1: seen.append(i * scale), [((1,), {}), ((2,), {"scale": 10}), ((3,), {})])
    for _ in range(7):
        fn()
    assert seen == [1, 20, 3, 1, 20, 3, 1]
    with pytest.raises(ValueError, match="at least one"):
        Rotating(print, [])


class _HostEvent:
    """Stands in for torch.cuda.Event on CPU: records the host clock (work here is synchronous)."""

    def __init__(self, enable_timing: bool = False) -> None:
        self.t = 0.0

    def record(self) -> None:
        self.t = time.perf_counter()

    def elapsed_time(self, end: _HostEvent) -> float:
        return (end.t - self.t) * 1000.0


def _spin(us: float) -> None:
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def test_time_interleaved_runs_the_schedule_and_attributes_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "Event", _HostEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(timing, "L2_FLUSH_BYTES", 4096)
    calls: list[str] = []

    def make(name: str, us: float) -> Callable[[], None]:
        def fn() -> None:
            calls.append(name)
            _spin(us)

        return fn

    cfg = TimingConfig(warmup_ms=2.0, rep_ms=30.0, min_reps=8, max_reps=40)
    out = time_interleaved({"slow": make("slow", 600.0), "fast": make("fast", 200.0)}, cfg, device="cpu")
    slow, fast = out["slow"], out["fast"]
    assert len(slow.samples_us) == len(fast.samples_us) >= 8
    assert 2.0 < slow.median_us / fast.median_us < 4.0
    assert min(fast.samples_us) >= 200.0
    assert min(slow.samples_us) >= 600.0
    timed = calls[-2 * len(slow.samples_us) :]
    assert timed[:4] == ["slow", "fast", "fast", "slow"]
    assert calls[:2] == ["slow", "fast"]  # the untimed first call of each
    assert slow.summary()["median_us"] == pytest.approx(slow.median_us, abs=1e-3)


def test_time_interleaved_needs_something_to_time() -> None:
    with pytest.raises(ValueError, match="at least one"):
        time_interleaved({})


def test_parse_clocks() -> None:
    assert parse_clocks("1980, 3201, 41, 120.52") == {
        "sm_mhz": 1980.0,
        "mem_mhz": 3201.0,
        "temperature_c": 41.0,
        "power_w": 120.52,
    }
    assert parse_clocks("1980 MHz, [N/A], 41, [Not Supported]")["mem_mhz"] is None
    with pytest.raises(ValueError, match="4 comma-separated"):
        parse_clocks("1980, 3201")


@pytest.mark.integration
def test_read_clocks_only_queries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The clock reader runs nvidia-smi with query flags only: it never sets anything."""
    log = tmp_path / "argv.txt"
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\necho "$@" > {log}\necho "1755, 2619, 38, 95.10"\n')
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    clocks = read_clocks("GPU-1234")
    assert clocks == {"sm_mhz": 1755.0, "mem_mhz": 2619.0, "temperature_c": 38.0, "power_w": 95.1}
    argv = log.read_text().split()
    assert argv[0] == "--query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw"
    assert argv[1:] == ["--format=csv,noheader,nounits", "-i", "GPU-1234"]


def test_read_clocks_without_nvidia_smi(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert "error" in read_clocks()


def test_input_bytes_counts_a_storage_two_views_share_once() -> None:
    from opgate.ops.base import SampleInput
    from opgate.validators.perf.timing import input_bytes

    qkv = torch.zeros(4, 24)
    shared = SampleInput(args=(qkv[:, :8], qkv[:, 8:16], 0.5))
    assert input_bytes([shared]) == 4 * 24 * 4
    apart = SampleInput(args=(torch.zeros(4, 8), torch.zeros(4, 8)))
    assert input_bytes([shared, apart]) == 4 * 24 * 4 + 2 * 4 * 8 * 4
