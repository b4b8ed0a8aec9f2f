"""The decoder-block comparison in the published report: opgate's ops vs stock PyTorch, end to end.

``opgate perf block`` measures on the GPU machine and writes
``block.json``; this module loads that file (never measures) and renders its
HTML section.  The Markdown is :func:`validators.perf.block_md.render_md`, the
same that wrote ``block.md``.  HTML bars are plain CSS widths, so the page
stays self-contained.
"""

from __future__ import annotations

from collections.abc import Iterator
from html import escape
from pathlib import Path
from typing import Any

from opgate.matrix.errors import ResultsFormatError
from opgate.matrix.files import read_json
from opgate.reports.perf import number_problem, shown
from opgate.validators.perf.block_md import flags, provenance, render_md, speedup

REQUIRED = ("config", "info", "parity_relerr", "blocks", "alone", "flags")
#: The block's shape, as the provenance line prints it.
CONFIG_KEYS = ("hidden", "heads", "seq", "batch", "ffn", "dtype")
PHASES = ("forward", "step")


def load(path: Path) -> dict[str, Any]:
    """``block.json``, checked field by field: anything the renderers cannot use is refused (exit 7)."""
    data: dict[str, Any] = read_json(path, what="decoder-block file", expect=dict)
    if not all(k in data for k in REQUIRED):
        raise ResultsFormatError(f"{path}: not a decoder-block result (needs {', '.join(REQUIRED)})")
    problem = format_problem(data)
    if problem:
        raise ResultsFormatError(f"{path}: not a decoder-block result: {problem}")
    return data


def _times_problems(times: Any, where: str) -> Iterator[str]:
    """Why ``times`` is not ``{name: {"median_us": time > 0, ...}}``, naming the field."""
    if not isinstance(times, dict):
        yield f"{where} is {shown(times)}, not an object"
    for name, timing in times.items():
        if not isinstance(timing, dict):
            yield f"{where}.{name} is {shown(timing)}, not an object"
        if why := number_problem(timing.get("median_us"), positive=True):
            yield f"{where}.{name}.median_us {why}"


def format_problem(data: dict[str, Any]) -> str | None:
    """Why ``data`` is not a block result the renderers can use, or None.

    Checked here, where the file and the field can be named, rather than met in
    :mod:`validators.perf.block_md` as a ``ZeroDivisionError`` (a median of 0 in a speed-up), an
    empty ``max()`` (a phase with no variant) or a ``TypeError`` (``alone: null``, ``flags: 1``).
    """
    return next(_problems(data), None)


def _problems(data: dict[str, Any]) -> Iterator[str]:
    """The problems in reading order; only the first is read (the generator is not resumed past a
    problem, so a later check may assume what the earlier ones found)."""
    yield from (
        f"{key} is {shown(data[key])}, not an object"
        for key in ("config", "info", "parity_relerr", "blocks", "alone")
        if not isinstance(data[key], dict)
    )
    missing = [k for k in CONFIG_KEYS if k not in data["config"]]
    if missing:
        yield f"config lacks {', '.join(missing)}"
    for phase in PHASES:
        times = data["blocks"].get(phase)
        if isinstance(times, dict) and not times:
            yield f"blocks.{phase} is empty: no variant was timed"
        yield from _times_problems(times, f"blocks.{phase}")
        yield from (
            f"blocks.{phase}.{k}: a variant is named implementation/mode (e.g. opgate/eager)"
            for k in times
            if "/" not in k
        )
    for key, err in data["parity_relerr"].items():
        if why := number_problem(err, nonnegative=True):
            yield f"parity_relerr.{key} {why}"
        yield from (
            f"parity_relerr.{key} has no time in blocks.{p}" for p in PHASES if key not in data["blocks"][p]
        )
    for op, times in data["alone"].items():
        yield from _times_problems(times, f"alone.{op}")
    flags = data["flags"]
    if not isinstance(flags, list):
        yield f"flags is {shown(flags)}, not an array"
    for i, flag in enumerate(flags):
        if not isinstance(flag, dict) or not all(
            isinstance(flag.get(k), str) for k in ("flag", "op", "mode")
        ):
            yield f"flags[{i}] is not an object with the strings flag, op and mode"


def render_html(data: dict[str, Any]) -> str:
    """A section for index.html: the step-time bars per mode, then the parity/alone tables."""
    bars = []
    for phase, label in (("forward", "forward"), ("step", "forward + backward")):
        times = data["blocks"][phase]
        worst = max(v["median_us"] for v in times.values()) or 1.0
        rows = "".join(
            f'<tr><th scope="row">{escape(k)}</th><td><div class="bar" style="width:'
            f'{100 * v["median_us"] / worst:.1f}%"></div></td><td>{v["median_us"]:.1f} us '
            f"{escape(speedup(data, phase, k))}</td></tr>"
            for k, v in times.items()
        )
        bars.append(f"<h3>{escape(label)}</h3><table class='block-bars'>{rows}</table>")
    alone = "".join(
        f"<tr><th scope='row'>{escape(op)}</th>"
        + "".join(
            f"<td>{t[k]['median_us']:.1f}</td>" if k in t else "<td>–</td>"
            for k in ("opgate", "torch", "torch-compile")
        )
        + "</tr>"
        for op, t in data["alone"].items()
    )
    parity = "".join(
        f"<tr><th scope='row'>{escape(k)}</th><td>{v:.2e}</td></tr>" for k, v in data["parity_relerr"].items()
    )
    flagged = "".join(f"<li>{escape(f.replace('**', ''))}</li>" for f in flags(data))
    return (
        f"<p class='muted'>{escape(provenance(data))}</p>{''.join(bars)}"
        "<h3>Parity (relerr vs float32)</h3><table>" + parity + "</table>"
        "<h3>Each op alone, inside-the-block inputs (forward, us)</h3>"
        "<table><tr><th>op</th><th>opgate</th><th>torch eager</th><th>torch compiled</th></tr>"
        + alone
        + f"</table><ul>{flagged}</ul>"
    )


__all__ = ["format_problem", "load", "render_html", "render_md"]
