"""The environment fingerprint: which torch, Triton, CUDA and GPU a verdict holds for.

Results from many machines (CPU runners, an H200 box, two torch versions) are
merged into one compat table, so every record carries the facts that make a
verdict true or false *somewhere*: torch and Triton versions, the CUDA runtime
torch was built with, the nvcc that built the extensions, the driver, the GPU
and its compute capability, Python and the platform.  The hostname is hashed:
enough to tell two runners apart, nothing to leak.

:class:`Fingerprint` is the one record of an environment: written by the
workers, read back by every report (reports import it from here; this module
imports torch only inside :func:`fingerprint`, which runs in a worker or the
``opgate.validators.env`` probe, never in the light-weight stages).  Its
:attr:`~Fingerprint.key` is the one environment key: results, compat columns,
diffs and perf history are keyed by it, so it must stay stable for a given
environment.
"""

from __future__ import annotations

import functools
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
from dataclasses import dataclass, field, fields
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


class FingerprintError(ValueError):
    """A fingerprint record that is not the one :func:`fingerprint` writes (the message names the key)."""


#: The JSON type of each scalar fingerprint field (``gpus`` and ``nvcc`` are checked apart).
_SCALAR_TYPES: Mapping[str, type] = {
    "fingerprint_version": int,
    "cudnn": int,
    "cpu_count": int,
    "cxx11abi": bool,
    **dict.fromkeys(("torch", "triton", "cuda_runtime", "driver", "gpu_name", "gpu_capability"), str),
    **dict.fromkeys(("python", "platform", "machine", "hostname_hash", "error"), str),
}


def _type_problem(name: str, value: Any) -> str:
    """What is wrong with a fingerprint field's JSON value ("" when nothing): reports read these as typed."""
    if name == "gpus":
        fits = isinstance(value, list | tuple) and all(isinstance(g, Mapping) for g in value)
        return "" if fits else "a list of GPU objects"
    if name == "nvcc":
        fits = isinstance(value, Mapping) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        )
        return "" if fits else "an object of CUDA release -> nvcc path strings"
    expected = _SCALAR_TYPES.get(name)
    if expected is None or (
        isinstance(value, expected) and not (expected is int and isinstance(value, bool))
    ):
        return ""
    return {int: "an integer", bool: "true or false", str: "a string"}[expected]


@dataclass(frozen=True)
class Fingerprint:
    """One environment, as written under ``env`` in every results.json and read by every report.

    The one definition of the format: :func:`fingerprint` builds it, workers
    send :meth:`to_json`, and the reports read records back with
    :meth:`from_json`, which accepts exactly these field names (a field this
    class does not know is an error, not a guess).  ``env_key`` is written
    alongside for people reading the JSON; readers recompute it with :attr:`key`.
    """

    fingerprint_version: int = FINGERPRINT_VERSION
    torch: str | None = None
    triton: str | None = None
    cuda_runtime: str | None = None
    cudnn: int | None = None
    cxx11abi: bool | None = None
    #: nvcc release -> path of every toolkit the run used (``{"13.0": "/usr/local/cuda/bin/nvcc"}``)
    nvcc: Mapping[str, str] = field(default_factory=dict)
    driver: str | None = None
    gpu_name: str | None = None
    #: ``"9.0"``: compute capability of the first GPU, as torch reports it
    gpu_capability: str | None = None
    gpus: tuple[Mapping[str, Any], ...] = ()
    python: str | None = None
    platform: str | None = None
    machine: str | None = None
    cpu_count: int | None = None
    hostname_hash: str | None = None
    #: why the run has no real fingerprint (the probe failed); its key is then ``unknown``
    error: str | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Fingerprint:
        """The record written by :meth:`to_json` (missing fields are None; unknown ones an error)."""
        if not isinstance(data, Mapping):
            raise FingerprintError(f"an environment fingerprint is a JSON object, got {type(data).__name__}")
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(k for k in data if k not in known and k != "env_key")
        if unknown:
            raise FingerprintError(
                f"unknown fingerprint field(s) {', '.join(map(repr, unknown))}; "
                f"a fingerprint has {', '.join(known)} (opgate.validators.env.Fingerprint)"
            )
        values: dict[str, Any] = {k: data[k] for k in known if data.get(k) is not None}
        for name, value in values.items():
            problem = _type_problem(name, value)
            if problem:
                raise FingerprintError(f"fingerprint field {name!r}: {problem}, got {value!r}")
        if "gpus" in values:
            values["gpus"] = tuple(dict(g) for g in values["gpus"])
        if "nvcc" in values:
            values["nvcc"] = dict(values["nvcc"])
        return cls(**values)

    def to_json(self) -> dict[str, Any]:
        """The JSON record (with ``env_key``), the inverse of :meth:`from_json`."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out.update(nvcc=dict(self.nvcc), gpus=[dict(g) for g in self.gpus], env_key=self.key)
        if self.error is None:
            del out["error"]
        return out

    @property
    def arch(self) -> str:
        """``"sm_90"`` for the first GPU, ``""`` on a machine without one."""
        if not self.gpu_name or not self.gpu_capability:
            return ""
        return "sm_" + str(self.gpu_capability).replace(".", "")

    @property
    def short_gpu(self) -> str:
        """``"H200"``: the first GPU's name for keys and column headers, ``""`` without one."""
        return short_gpu_name(self.gpu_name) if self.gpu_name and self.arch else ""

    @property
    def key(self) -> str:
        """Stable column key, e.g. ``pt2.13.0-cpu-triton3.8.0-py3.11``
        or ``pt2.11.0+cu130-H200-sm_90-triton3.6.0-py3.12``.

        The torch local version is kept (``+cu130`` says which CUDA build) except
        ``+cpu``, which the device part already says.  Only the first GPU names
        the device: one machine = one column, whichever GPUs its cells ran on.
        Driver, hostname and Python's patch release are left out on purpose: two
        runners of the same kind land in the same column.
        """
        if self.torch is None:
            return "unknown"
        parts = [f"pt{self.torch.removesuffix('+cpu')}"]
        parts += [self.short_gpu, self.arch] if self.arch else ["cpu"]
        if self.triton:
            parts.append(f"triton{self.triton}")
        if self.python:
            parts.append("py" + ".".join(self.python.split(".")[:2]))
        return "-".join(parts)


def _cudnn_version(torch: Any) -> int | None:
    """cuDNN's version, or None: with no device visible torch's own probe raises."""
    try:
        return int(torch.backends.cudnn.version()) if torch.backends.cudnn.is_available() else None
    except (RuntimeError, ValueError):
        return None


@functools.cache
def platform_name() -> str:
    """``Linux-6.8.0-x86_64-glibc-2.36``: what ``platform.platform()`` says, without its ``uname -p``
    child process (it iterates ``uname()``, whose ``processor`` runs one on Linux)."""
    return "-".join([platform.system(), platform.release(), platform.machine(), *platform.libc_ver()])


def fingerprint() -> Fingerprint:
    """Facts about the running interpreter's environment (imports torch)."""
    import torch

    nvcc = shutil.which("nvcc")
    gpus = _gpus()
    return Fingerprint(
        torch=torch.__version__,
        triton=_dist_version("triton"),
        cuda_runtime=torch.version.cuda,
        cudnn=_cudnn_version(torch),
        cxx11abi=bool(torch.compiled_with_cxx11_abi()),
        nvcc={nvcc_version(nvcc) or "unknown": nvcc} if nvcc else {},
        driver=driver_version() if gpus else None,
        gpu_name=gpus[0]["name"] if gpus else None,
        gpu_capability=gpus[0]["capability"] if gpus else None,
        gpus=tuple(gpus),
        python=platform.python_version(),
        platform=platform_name(),
        machine=platform.machine(),
        cpu_count=os.cpu_count(),
        hostname_hash=hashlib.sha256(socket.gethostname().encode()).hexdigest()[:12],
    )


def short_gpu_name(name: str) -> str:
    """``"NVIDIA H200"`` -> ``"H200"``; ``"NVIDIA A100-SXM4-80GB"`` -> ``"A100-SXM4-80GB"``."""
    name = re.sub(r"^(NVIDIA|Tesla)\s+", "", name.strip())
    return re.sub(r"[^A-Za-z0-9.+_-]+", "_", name) or "gpu"


def env_key(fp: Mapping[str, Any] | Fingerprint) -> str:
    """The one environment key of a fingerprint record (see :attr:`Fingerprint.key`)."""
    return (fp if isinstance(fp, Fingerprint) else Fingerprint.from_json(fp)).key


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


def visible_gpus(python: str = sys.executable) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """(the GPUs a run's workers may be given, the probe's fingerprint when one was needed).

    Nothing where no GPU can exist (no driver: no CUDA probe on a CPU machine);
    ``nvidia-smi`` when it can answer (a fraction of a second); else a torch
    probe in a subprocess (it keeps CUDA out of the parent).
    """
    from opgate.matrix.errors import OpgateError
    from opgate.validators.device import gpu_hardware_possible

    if not gpu_hardware_possible():
        return [], None
    fast = list_gpus()
    if fast is not None:
        return fast, None
    try:
        fp = probe(python)
    except (OSError, RuntimeError, ValueError) as exc:
        raise OpgateError(f"cannot probe this machine's GPUs: {exc}") from exc
    return list(fp.get("gpus") or []), fp


def main() -> None:
    json.dump(fingerprint().to_json(), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
