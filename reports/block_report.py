"""The decoder-block comparison in the published report: opgate's ops vs stock PyTorch, end to end.

``opgate perf block`` measures on the GPU machine and writes
``block.json``; this module loads that file (never measures) and renders its
HTML section.  The Markdown is :func:`validators.perf.block_md.render_md`, the
same that wrote ``block.md``.  HTML bars are plain CSS widths, so the page
stays self-contained.
"""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Any

from opgate.matrix.errors import ResultsFormatError
from opgate.matrix.files import read_json
from opgate.validators.perf.block_md import flags, provenance, render_md, speedup

REQUIRED = ("config", "info", "parity_relerr", "blocks", "alone", "flags")


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = read_json(path, what="decoder-block file", expect=dict)
    if not all(k in data for k in REQUIRED):
        raise ResultsFormatError(f"{path}: not a decoder-block result (needs {', '.join(REQUIRED)})")
    return data


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


__all__ = ["load", "render_html", "render_md"]
