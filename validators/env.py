"""The environment fingerprint: which torch, Triton, CUDA and GPU a verdict holds for.

Results from many machines (CPU runners, an H200 box, two torch versions) are
merged into one compat table, so every record carries the facts that make a
verdict true or false *somewhere*: torch and Triton versions, the CUDA runtime
torch was built with, the nvcc that built the extensions, the driver, the GPU
and its compute capability, Python and the platform.  The hostname is hashed:
enough to tell two runners apart, nothing to leak.

:func:`fingerprint` imports torch, so it runs in a worker (or the
``opgate.env`` probe), never in the light-weight stages.
:func:`env_key` is a pure function of the fingerprint dict; reports use it to
key their columns, so it must stay stable for a given environment.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

FINGERPRINT_VERSION = 1


def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def nvcc_version(nvcc: str | os.PathLike[str]) -> str | None:
    """``"13.0"`` from ``nvcc --version`` ("Cuda compilation tools, release 13.0, V13.0.88")."""
    try:
        out = subprocess.run(
            [os.fspath(nvcc), "--version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"release (\d+\.\d+)", out.stdout)
    return m.group(1) if m else None


def driver_version() -> str | None:
    """The NVIDIA kernel driver version, without creating a CUDA context."""
    proc = Path("/proc/driver/nvidia/version")
    if proc.exists():
        m = re.search(
            r"Kernel Module\s+(?:for \S+\s+)?(\d+\.\d+(?:\.\d+)?)", proc.read_text(errors="replace")
        )
        if m:
            return m.group(1)
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run(
                [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        line = out.stdout.strip().splitlines()
        return line[0].strip() if out.returncode == 0 and line else None
    return None


def _gpus() -> list[dict[str, Any]]:
    import torch

    if not torch.cuda.is_available():
        return []
    gpus = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        gpus.append(
            {
                "index": i,
                "name": props.name,
                "capability": f"{props.major}.{props.minor}",
                "memory_gib": round(props.total_memory / 2**30, 1),
                "sms": props.multi_processor_count,
            }
        )
    return gpus


def fingerprint() -> dict[str, Any]:
    """Facts about the running interpreter's environment (imports torch)."""
    import torch

    nvcc = shutil.which("nvcc")
    gpus = _gpus()
    fp: dict[str, Any] = {
        "fingerprint_version": FINGERPRINT_VERSION,
        "torch": torch.__version__,
        "triton": _dist_version("triton"),
        "cuda_runtime": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "cxx11abi": bool(torch.compiled_with_cxx11_abi()),
        "nvcc": {nvcc_version(nvcc) or "unknown": nvcc} if nvcc else {},
        "driver": driver_version() if gpus else None,
        "gpu_name": gpus[0]["name"] if gpus else None,
        "gpu_capability": gpus[0]["capability"] if gpus else None,
        "gpus": gpus,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "hostname_hash": hashlib.sha256(socket.gethostname().encode()).hexdigest()[:12],
    }
    fp["env_key"] = env_key(fp)
    return fp


def short_gpu_name(name: str) -> str:
    """``"NVIDIA H200"`` -> ``"H200"``; ``"NVIDIA A100-SXM4-80GB"`` -> ``"A100-SXM4-80GB"``."""
    name = re.sub(r"^(NVIDIA|Tesla)\s+", "", name.strip())
    return re.sub(r"[^A-Za-z0-9.+_-]+", "_", name) or "gpu"


def env_key(fp: Mapping[str, Any]) -> str:
    """Stable column key of a fingerprint, e.g. ``pt2.13.0-cpu-triton3.8.0-py3.11``
    or ``pt2.11.0+cu130-H200-sm_90-triton3.6.0-py3.12``.

    The torch local version is kept (``+cu130`` says which CUDA build) except
    ``+cpu``, which the device part already says.  Only the first GPU names the
    device: one machine = one column, whichever GPUs its cells ran on.
    """
    torch_v = str(fp.get("torch") or "none")
    torch_v = torch_v.removesuffix("+cpu")
    parts = [f"pt{torch_v}"]
    gpu, cap = fp.get("gpu_name"), fp.get("gpu_capability")
    if gpu and cap:
        parts += [short_gpu_name(str(gpu)), "sm_" + str(cap).replace(".", "")]
    else:
        parts.append("cpu")
    if fp.get("triton"):
        parts.append(f"triton{fp['triton']}")
    py = str(fp.get("python") or "")
    if py:
        parts.append("py" + ".".join(py.split(".")[:2]))
    return "-".join(parts)


def probe(python: str = sys.executable, timeout_s: float = 300.0) -> dict[str, Any]:
    """Fingerprint computed in a fresh subprocess of ``python`` (the workers' interpreter).

    Used by the parent when it needs the GPU list before starting any worker;
    the subprocess keeps CUDA out of the parent process.
    """
    out = subprocess.run(
        [python, "-m", "opgate.validators.env"],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, **DEVICE_ORDER},
        check=False,
    )
    if out.returncode != 0:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"environment probe failed (exit {out.returncode}): {tail}")
    data: dict[str, Any] = json.loads(out.stdout)
    return data


#: Numbering of GPUs that nvidia-smi and CUDA share; set for every GPU worker
#: (CUDA's default, FASTEST_FIRST, may number mixed GPUs differently).
DEVICE_ORDER = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def list_gpus(timeout_s: float = 30.0) -> list[dict[str, Any]] | None:
    """The GPUs a worker may be given, from ``nvidia-smi`` in a fraction of a second, or None.

    What the scheduler needs before any worker starts is the GPU list; a
    ``torch`` probe costs 4-5 s on a GPU host (import, CUDA init), this costs
    ~0.1 s.  Indices follow ``CUDA_VISIBLE_DEVICES`` as CUDA would (up to the
    first entry that names no GPU) under ``CUDA_DEVICE_ORDER=PCI_BUS_ID``.
    None (use :func:`probe`) without nvidia-smi, or when ``CUDA_VISIBLE_DEVICES``
    names UUIDs or MIG slices.
    """
    smi = shutil.which("nvidia-smi")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    entries = [e.strip() for e in visible.split(",")] if visible is not None else None
    if smi is None or (entries is not None and not all(e.isdigit() for e in entries if e)):
        return None
    query = "--query-gpu=index,name,compute_cap,memory.total"
    try:
        out = subprocess.run(
            [smi, query, "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=timeout_s, check=True,
        )  # fmt: skip
        rows = [[c.strip() for c in line.split(",")] for line in out.stdout.strip().splitlines()]
        by_index = {int(r[0]): {"name": r[1], "capability": r[2], "memory_gib": round(float(r[3]) / 1024, 1)}
                    for r in rows}  # fmt: skip
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None
    order = sorted(by_index) if entries is None else []
    for entry in entries or []:
        if not entry.isdigit() or int(entry) not in by_index:
            break  # CUDA ignores everything from the first invalid entry on
        order.append(int(entry))
    return [{"index": ordinal, **by_index[phys]} for ordinal, phys in enumerate(order)]


def main() -> None:
    json.dump(fingerprint(), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
