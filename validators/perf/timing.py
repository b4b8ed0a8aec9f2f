"""GPU timing that does not lie: CUDA events, warm-up, L2 flush, rotating inputs, interleaved A/B.

What each part guards against:

* **events, not host clocks** — kernels run asynchronously; an event pair on
  the stream brackets exactly the device work of one call.
* **warm-up** — the first calls compile (Triton, Inductor), load modules and
  create library handles; they are run and thrown away.
* **L2 flush** — a 256 MiB buffer (H200 L2 is 50 MiB) is overwritten before
  every repetition, so no repetition starts with the previous one's data hot.
* **rotating inputs** — where the inputs are small enough to sit in L2 they
  are also cycled over several copies (see :func:`rotation_count`).
* **interleaved A/B** — candidate and baseline repetitions alternate in one
  process (ABBA order, :func:`ab_schedule`), so clock and thermal drift hit
  both alike and their ratio stays honest.
* **clocks recorded, never set** — ``nvidia-smi`` is queried read-only before
  and after; a throttled run is visible in the record instead of silently slow.

Every repetition's time is kept (``samples_us``): regression detection needs
distributions, not one number.  torch is imported lazily, so the pure parts
(schedules, rotation sizing, clock parsing) are testable anywhere.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opgate.validators.perf.stats import iqr, median

#: Bytes overwritten before each repetition (well above any current GPU's L2).
L2_FLUSH_BYTES = 256 * 2**20
#: Inputs smaller than this multiple of L2 are rotated over several copies.
ROTATE_BELOW_L2_FACTOR = 2
MAX_ROTATIONS = 32
CLOCK_FIELDS = ("clocks.sm", "clocks.mem", "temperature.gpu", "power.draw")
_CLOCK_KEYS = ("sm_mhz", "mem_mhz", "temperature_c", "power_w")


@dataclass(frozen=True)
class TimingConfig:
    """How long to warm up and measure (ms of device time, like ``do_bench``), and rep bounds."""

    warmup_ms: float = 25.0
    rep_ms: float = 100.0
    min_reps: int = 20
    max_reps: int = 400
    flush_l2: bool = True

    def __post_init__(self) -> None:
        if self.min_reps < 1 or self.max_reps < self.min_reps:
            raise ValueError(f"need 1 <= min_reps <= max_reps, got {self.min_reps}, {self.max_reps}")
        if self.warmup_ms < 0 or self.rep_ms <= 0:
            raise ValueError(f"warmup_ms must be >= 0 and rep_ms > 0, got {self.warmup_ms}, {self.rep_ms}")


#: What the per-cell perf check (and the study that vouches for it) uses: ~100 samples per shape.
CHECK_TIMING = TimingConfig(warmup_ms=10.0, rep_ms=50.0, min_reps=20, max_reps=100)


@dataclass
class Timing:
    """All repetition times (us) of one callable in one session."""

    name: str
    samples_us: list[float] = field(default_factory=list)

    @property
    def median_us(self) -> float:
        return median(self.samples_us)

    @property
    def iqr_us(self) -> float:
        return iqr(self.samples_us)

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "median_us": round(self.median_us, 4),
            "iqr_us": round(self.iqr_us, 4),
            "samples_us": [round(s, 4) for s in self.samples_us],
        }


def ab_schedule(names: Sequence[str], reps: int) -> list[str]:
    """Call order for interleaved timing: forward order on even reps, reversed on odd (ABBA...).

    Every name runs ``reps`` times and, over each pair of reps, equally often
    in each position, so "runs right after the flush" or "runs second" favours
    nobody.
    """
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate names in {list(names)}")
    order: list[str] = []
    for i in range(reps):
        order.extend(names if i % 2 == 0 else list(reversed(names)))
    return order


def input_bytes(samples: Iterable[Any]) -> int:
    """Bytes of the distinct storages behind the samples' tensor arguments (two views of one count once).

    What :func:`rotation_count` sizes copies by, and what a cell's context weighs before keeping a draw.
    """
    storages: dict[int, int] = {}
    for sample in samples:
        for t in sample.tensors():
            storage = t.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def rotation_count(input_bytes: int, l2_bytes: int, max_copies: int = MAX_ROTATIONS) -> int:
    """How many input copies to cycle so that consecutive calls do not find their inputs in L2.

    Inputs of at least ``2 x L2`` cannot stay resident: one copy.  Smaller ones
    get enough copies to span ``2 x L2`` (capped at ``max_copies``; the L2
    flush between repetitions covers the rest).
    """
    if input_bytes <= 0 or l2_bytes <= 0:
        return 1
    span = ROTATE_BELOW_L2_FACTOR * l2_bytes
    if input_bytes >= span:
        return 1
    return max(1, min(max_copies, math.ceil(span / input_bytes)))


def rep_count(per_call_us: float, budget_ms: float, config: TimingConfig) -> int:
    """Repetitions that fit ``budget_ms`` at ``per_call_us`` each, clamped to the config's bounds."""
    if per_call_us <= 0 or not math.isfinite(per_call_us):
        return config.max_reps
    return max(config.min_reps, min(config.max_reps, int(budget_ms * 1000.0 / per_call_us)))


class Rotating:
    """A no-argument callable cycling ``fn`` over argument sets: call i uses set i mod k."""

    def __init__(self, fn: Callable[..., Any], arg_sets: Sequence[tuple[tuple[Any, ...], dict[str, Any]]]):
        if not arg_sets:
            raise ValueError("Rotating needs at least one argument set")
        self.fn = fn
        self.arg_sets = list(arg_sets)
        self.calls = 0

    def __call__(self) -> Any:
        args, kwargs = self.arg_sets[self.calls % len(self.arg_sets)]
        self.calls += 1
        return self.fn(*args, **kwargs)


def _events(torch: Any, n: int) -> list[Any]:
    return [torch.cuda.Event(enable_timing=True) for _ in range(n)]


def time_interleaved(
    fns: Mapping[str, Callable[[], Any]], config: TimingConfig | None = None, device: Any = None
) -> dict[str, Timing]:
    """Time each no-argument callable on the current CUDA stream, interleaved; samples in us.

    ``device``: where the L2 flush buffer lives (default: the current CUDA device).

    1. one untimed call each (compilation, autotuning, lazy init), synchronize;
    2. five timed calls each estimate the per-call cost, which sizes the
       warm-up and the repetition count (``rep_ms`` of device time for the
       whole interleaved set, within ``min_reps..max_reps``);
    3. warm-up calls, then the timed ABBA schedule: flush L2, event, call,
       event.  One synchronize at the end; nothing in the loop waits on the host.
    """
    import torch

    config = config or TimingConfig()
    if not fns:
        raise ValueError("time_interleaved needs at least one callable")
    names = list(fns)
    dev = torch.device("cuda") if device is None else torch.device(device)
    flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device=dev) if config.flush_l2 else None

    def run(order: Sequence[str]) -> list[float]:
        ev = _events(torch, 2 * len(order))
        for i, name in enumerate(order):
            if flush is not None:
                flush.zero_()
            ev[2 * i].record()
            fns[name]()
            ev[2 * i + 1].record()
        torch.cuda.synchronize(dev)
        return [ev[2 * i].elapsed_time(ev[2 * i + 1]) * 1000.0 for i in range(len(order))]

    with torch.cuda.device(dev) if dev.type == "cuda" else contextlib.nullcontext():
        return _timed(fns, names, config, run, dev)


def _timed(
    fns: Mapping[str, Callable[[], Any]],
    names: list[str],
    config: TimingConfig,
    run: Callable[[Sequence[str]], list[float]],
    dev: Any,
) -> dict[str, Timing]:
    import torch

    for name in names:
        fns[name]()
    torch.cuda.synchronize(dev)
    probe = ab_schedule(names, 5)
    estimate: dict[str, list[float]] = {name: [] for name in names}
    for name, us in zip(probe, run(probe), strict=True):
        estimate[name].append(us)
    per_set_us = sum(median(v) for v in estimate.values())
    warm = rep_count(per_set_us, config.warmup_ms, TimingConfig(min_reps=1, max_reps=1000))
    run(ab_schedule(names, warm))
    order = ab_schedule(names, rep_count(per_set_us, config.rep_ms, config))
    samples = run(order)
    out = {name: Timing(name) for name in names}
    for name, us in zip(order, samples, strict=True):
        out[name].samples_us.append(us)
    return out


def time_one(
    fn: Callable[[], Any], config: TimingConfig | None = None, name: str = "fn", device: Any = None
) -> Timing:
    """:func:`time_interleaved` of a single callable."""
    return time_interleaved({name: fn}, config, device)[name]


# --------------------------------------------------------------------------- clocks (read only)


def parse_clocks(line: str) -> dict[str, float | None]:
    """One ``nvidia-smi --format=csv,noheader,nounits`` line of CLOCK_FIELDS -> numbers (None for N/A)."""
    parts = [p.strip() for p in line.strip().split(",")]
    if len(parts) != len(CLOCK_FIELDS):
        raise ValueError(f"expected {len(CLOCK_FIELDS)} comma-separated fields, got {line!r}")
    return {key: _number(raw) for key, raw in zip(_CLOCK_KEYS, parts, strict=True)}


def _number(raw: str) -> float | None:
    """``"1980"`` / ``"1980 MHz"`` -> 1980.0; ``"[N/A]"``, ``"[Not Supported]"``, ``""`` -> None."""
    try:
        return float(raw.split(maxsplit=1)[0]) if raw else None
    except ValueError:
        return None


def gpu_selector(device_index: int = 0) -> str:
    """The ``nvidia-smi -i`` value of a CUDA device: its UUID (immune to CUDA_VISIBLE_DEVICES)."""
    import torch

    uuid = getattr(torch.cuda.get_device_properties(device_index), "uuid", None)
    if uuid is not None:
        text = str(uuid)
        return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    return visible[device_index] if device_index < len(visible) else str(device_index)


def read_clocks(selector: str = "0") -> dict[str, Any]:
    """SM/memory clocks, temperature and power now, read with ``nvidia-smi`` (changes nothing)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {"error": "nvidia-smi not found"}
    cmd = [smi, f"--query-gpu={','.join(CLOCK_FIELDS)}", "--format=csv,noheader,nounits", "-i", selector]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": f"nvidia-smi failed: {exc}"}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"error": f"nvidia-smi exit {proc.returncode}: {(proc.stderr or proc.stdout).strip()[:200]}"}
    try:
        return dict(parse_clocks(lines[0]))
    except ValueError as exc:
        return {"error": str(exc)}
