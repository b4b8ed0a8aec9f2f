"""Environment identity: which machine a verdict holds for, and how to label it.

A cell id already names torch major.minor, CUDA and arch.  The environment key
adds what the id cannot: the exact torch/triton/python build and the GPU that
really ran the cell, so that results merged from many machines stay apart (a
``build`` cell for sm_90 verified on a CPU runner is not the same evidence as
the same cell on an H200).

The fingerprint is written by the validators; ``validators.env.env_key`` is the
canonical key when that module exists.  The local fallback reads the same
fields under the names the fingerprint may use, so reports never depend on the
validators being importable (a publish job installs no torch).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping
from typing import Any

from opgate.matrix.cell import Cell, torch_major_minor

_KeyFn = Callable[[Mapping[str, Any]], str]


def _first(fp: Mapping[str, Any], *names: str) -> Any:
    """First present, non-empty value among ``names`` (fingerprints evolve; stay lenient)."""
    for name in names:
        value = fp.get(name)
        if value not in (None, "", [], {}):
            return value
    return None


def _gpu_record(fp: Mapping[str, Any]) -> Mapping[str, Any]:
    """The GPU sub-record when the fingerprint nests one (``gpu: {name, capability}``)."""
    gpu = fp.get("gpu")
    if isinstance(gpu, list) and gpu:
        gpu = gpu[0]
    return gpu if isinstance(gpu, Mapping) else {}


def gpu_name(fp: Mapping[str, Any]) -> str:
    """Full GPU name ("NVIDIA H200"), or "" on a machine without one."""
    nested = _gpu_record(fp)
    value = _first(nested, "name") or _first(fp, "gpu_name", "device_name")
    if value is None and isinstance(fp.get("gpu"), str):
        value = fp["gpu"]
    return str(value or "")


def capability(fp: Mapping[str, Any]) -> str:
    """Compute capability as an arch name ("sm_90"), or "" without a GPU.

    Accepts ``"9.0"``, ``[9, 0]``, ``"sm_90"`` and ``"90"``: whichever the
    fingerprint writer chose, arch columns compare against ``matrix.cell.ARCHES``.
    """
    nested = _gpu_record(fp)
    value = _first(nested, "capability", "compute_capability", "cc") or _first(
        fp, "gpu_capability", "capability", "compute_capability", "cc"
    )
    if value is None:
        return ""
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return f"sm_{int(value[0])}{int(value[1])}"
    text = str(value).strip()
    if text.startswith("sm_"):
        return text
    if match := re.fullmatch(r"(\d+)\.(\d+)", text):
        return f"sm_{match[1]}{match[2]}"
    if text.isdigit():
        return f"sm_{text}"
    return text


def short_gpu_name(name: str) -> str:
    """ "NVIDIA H200" -> "H200": column headers have little room."""
    for prefix in ("NVIDIA ", "Tesla ", "GeForce "):
        name = name.removeprefix(prefix)
    return name.strip()


def cuda_runtime(fp: Mapping[str, Any]) -> str:
    """CUDA runtime torch was built with ("13.0"), or "" for a CPU build."""
    return str(_first(fp, "cuda_runtime", "cuda", "torch_cuda", "cuda_version") or "")


def local_env_key(fp: Mapping[str, Any]) -> str:
    """Readable, stable key from the fingerprint fields that change a verdict.

    torch (full version), CUDA runtime, GPU (name + capability) or ``cpu``,
    triton and python major.minor.  Driver, hostname and clocks are left out on
    purpose: two runners of the same kind must land in the same environment.
    """
    torch_v = str(_first(fp, "torch", "torch_version") or "unknown")
    cuda = cuda_runtime(fp)
    gpu = gpu_name(fp)
    device = (
        f"{re.sub(r'[^A-Za-z0-9]+', '_', short_gpu_name(gpu)).strip('_')}-{capability(fp)}" if gpu else "cpu"
    )
    triton = str(_first(fp, "triton", "triton_version") or "none")
    py = str(_first(fp, "python", "python_version") or "unknown")
    py_mm = ".".join(py.split(".")[:2])
    parts = [f"pt{torch_v}", f"cu{cuda}" if cuda else "nocuda", device, f"triton{triton}", f"py{py_mm}"]
    return "-".join(parts)


def _validators_env_key() -> _KeyFn | None:
    try:
        module = importlib.import_module("opgate.validators.env")
    except ImportError:
        return None
    fn = getattr(module, "env_key", None)
    return fn if callable(fn) else None


def env_key(fp: Mapping[str, Any]) -> str:
    """The canonical key: ``validators.env.env_key`` when importable, else the key the
    fingerprint recorded for itself, else :func:`local_env_key`."""
    fn = _validators_env_key()
    if fn is not None:
        return str(fn(fp))
    recorded = fp.get("env_key")
    return recorded if isinstance(recorded, str) and recorded else local_env_key(fp)


def column_of(cell: Cell) -> str:
    """Release-table column for a cell: torch major.minor, CUDA, arch ("pt2.11 cu13.0 sm_90")."""
    torch_mm = f"pt{torch_major_minor(cell.torch)}"
    if cell.arch == "cpu":
        return f"{torch_mm} cpu"
    return f"{torch_mm} cu{cell.cuda} {cell.arch}"


def column_sort_key(column: str) -> tuple[Any, ...]:
    """Columns by torch version, then CUDA, with cpu first (numeric, not lexical: 2.9 < 2.13)."""

    def nums(text: str) -> tuple[int, ...]:
        return tuple(int(x) for x in re.findall(r"\d+", text))

    parts = column.split()
    torch_part = nums(parts[0]) if parts else ()
    if len(parts) < 3:
        return (torch_part, 0, (), ())
    return (torch_part, 1, nums(parts[1]), nums(parts[2]))
