"""The two ceilings every perf figure is read against, measured on the device in the same run.

Datasheet numbers are leads, not ceilings: what a copy kernel and the vendor
GEMM actually reach on *this* card, with *this* driver and clocks, is what
"% of roofline" must be relative to.  Measured once per run and cached:

* ``copy_gbps`` — device-to-device ``copy_`` of a 1 GiB buffer, bytes read +
  bytes written over the median time (4274 GB/s on an H200, 2 GiB).
* ``gemm_tflops`` — an 8192^3 bf16 ``torch.mm`` on random data (zeros run
  faster than real data on some GPUs), 2 M N K FLOPs over the median time.

Cache: per process (a worker runs many cells) and, when given a path, in a
JSON file keyed by the GPU's UUID so the other workers of the run read it
instead of measuring again.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from opgate.validators.perf.timing import TimingConfig, time_one

COPY_BYTES = 2**30
GEMM_SIZE = 8192
_CONFIG = TimingConfig(warmup_ms=50.0, rep_ms=300.0, min_reps=20, max_reps=200, flush_l2=False)


@dataclass(frozen=True)
class Ceilings:
    """Measured ceilings of one device (and how they were measured)."""

    device: str
    key: str
    copy_gbps: float
    gemm_tflops: float
    copy_bytes: int
    gemm_size: int
    copy_median_us: float
    gemm_median_us: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def brief(self) -> dict[str, float]:
        """The two numbers a perf record carries."""
        return {"copy_gbps": round(self.copy_gbps, 1), "gemm_tflops": round(self.gemm_tflops, 1)}


_PROCESS_CACHE: dict[str, Ceilings] = {}


def device_key(device_index: int = 0) -> tuple[str, str]:
    """(name, key) of a CUDA device; the key is its UUID where torch exposes one."""
    import torch

    props = torch.cuda.get_device_properties(device_index)
    uuid = getattr(props, "uuid", None)
    return str(props.name), str(uuid) if uuid is not None else f"{props.name}#{device_index}"


def _copy_us(dev: Any) -> float:
    import torch

    src = torch.empty(COPY_BYTES // 2, dtype=torch.bfloat16, device=dev).normal_()
    dst = torch.empty_like(src)
    return time_one(lambda: dst.copy_(src), _CONFIG, "copy", dev).median_us


def _gemm_us(dev: Any) -> float:
    import torch

    gen = torch.Generator(device=dev).manual_seed(0)
    shape = (GEMM_SIZE, GEMM_SIZE)
    a = torch.randn(shape, dtype=torch.bfloat16, device=dev, generator=gen)
    b = torch.randn(shape, dtype=torch.bfloat16, device=dev, generator=gen)
    c = torch.empty(shape, dtype=torch.bfloat16, device=dev)
    return time_one(lambda: torch.mm(a, b, out=c), _CONFIG, "gemm", dev).median_us


def measure(device_index: int = 0) -> Ceilings:
    """Measure both ceilings now (about a second of device time; ~2.4 GiB, freed after)."""
    import torch

    name, key = device_key(device_index)
    dev = torch.device("cuda", device_index)
    with torch.cuda.device(dev):
        copy_us = _copy_us(dev)
        gemm_us = _gemm_us(dev)
        torch.cuda.empty_cache()
    return Ceilings(
        device=name,
        key=key,
        copy_gbps=2 * COPY_BYTES / (copy_us * 1e-6) / 1e9,
        gemm_tflops=2 * GEMM_SIZE**3 / (gemm_us * 1e-6) / 1e12,
        copy_bytes=2 * COPY_BYTES,
        gemm_size=GEMM_SIZE,
        copy_median_us=copy_us,
        gemm_median_us=gemm_us,
    )


def _read(path: Path, key: str) -> Ceilings | None:
    try:
        data = json.loads(path.read_text())
        return Ceilings(**data[key])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write(path: Path, ceilings: Ceilings) -> None:
    try:
        data = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError):
        data = {}
    data[ceilings.key] = ceilings.to_json()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)


def get(device_index: int = 0, cache_file: Path | None = None) -> Ceilings:
    """The run's ceilings for a device: process cache, then ``cache_file``, else measured (and stored)."""
    _, key = device_key(device_index)
    if key in _PROCESS_CACHE:
        return _PROCESS_CACHE[key]
    found = _read(cache_file, key) if cache_file is not None else None
    if found is None:
        found = measure(device_index)
        if cache_file is not None:
            _write(cache_file, found)
    _PROCESS_CACHE[key] = found
    return found
