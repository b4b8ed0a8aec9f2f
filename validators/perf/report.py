"""What every GPU perf command shares: the GPU-only guard, run metadata, and writing JSON + Markdown.

Each command (``bench``, ``study``, ``block``) writes ``DIR/<name>.json`` (every
number, samples included) and ``DIR/<name>.md`` (the table a person reads);
both carry the device, versions, clocks and date, so a committed table says
where and when it was true.
"""

from __future__ import annotations

import datetime as dt
import json
import platform
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from opgate.matrix.errors import UsageError

#: The one benchmark format: what ``opgate perf bench`` writes (``validators.perf.bench``) and
#: ``opgate bench`` / ``publish --bench`` read (``reports.bench_table``).  Here because this
#: module imports no torch, so the reports can import it too.
BENCH_FORMAT = "opgate.bench/1"


class GpuRequiredError(UsageError):
    """A perf command was started where no CUDA device is visible (exit code of a usage error)."""


def require_cuda(command: str) -> None:
    """Raise :class:`GpuRequiredError` with a clear message when there is no CUDA device."""
    import torch

    if not torch.cuda.is_available():
        raise GpuRequiredError(
            f"{command} measures GPU performance and needs a CUDA device; none is visible here "
            f"(torch {torch.__version__}). Run it on the GPU machine."
        )


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def run_info(device_index: int = 0) -> dict[str, Any]:
    """Device, versions, clocks and time of a perf run (call on the GPU machine)."""
    import torch

    from opgate.validators.perf.timing import gpu_selector, read_clocks

    props = torch.cuda.get_device_properties(device_index)
    return {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "device": props.name,
        "capability": f"{props.major}.{props.minor}",
        "sms": props.multi_processor_count,
        "l2_bytes": int(getattr(props, "L2_cache_size", 0)),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": _version("triton"),
        "liger_kernel": _version("liger-kernel"),
        "python": platform.python_version(),
        "clocks": read_clocks(gpu_selector(device_index)),
    }


def header(title: str, info: dict[str, Any]) -> list[str]:
    """Markdown title and the run's provenance line."""
    provenance = (
        f"{info.get('device')} (sm_{str(info.get('capability', '?')).replace('.', '')}), "
        f"torch {info.get('torch')}, CUDA {info.get('cuda')}, triton {info.get('triton')}, "
        f"liger-kernel {info.get('liger_kernel') or 'not installed'}, {info.get('date')}; "
        f"clocks at start: {fmt_clocks(info.get('clocks') or {})}"
    )
    return [f"# {title}", "", provenance, ""]


def fmt_clocks(clocks: dict[str, Any]) -> str:
    if "error" in clocks:
        return f"unavailable ({clocks['error']})"
    return (
        f"SM {clocks.get('sm_mhz')} MHz, mem {clocks.get('mem_mhz')} MHz, "
        f"{clocks.get('temperature_c')} C, {clocks.get('power_w')} W"
    )


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """A Markdown table (None shows as an em dash)."""

    def cell(v: Any) -> str:
        return "—" if v is None else str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return lines


def write_outputs(out: Path, name: str, data: dict[str, Any], markdown: Sequence[str]) -> tuple[Path, Path]:
    """Write ``out/name.json`` and ``out/name.md``; returns both paths."""
    out.mkdir(parents=True, exist_ok=True)
    js, md = out / f"{name}.json", out / f"{name}.md"
    js.write_text(json.dumps(data, indent=1) + "\n")
    md.write_text("\n".join(markdown) + "\n")
    return js, md
