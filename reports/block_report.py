"""The decoder-block comparison in the published report: opgate's ops vs stock PyTorch, end to end.

``python -m validators.perf block`` measures on the GPU machine and writes
``block.json``; this module renders that file (never measures): parity of each
variant against the float32 block, forward and training-step medians with the
speed-up over stock PyTorch in the same mode, each op alone on the inputs it
gets inside the block, and the "faster alone, slower in the block" flags.
HTML bars are plain CSS widths, so the page stays self-contained.
"""

from __future__ import annotations

import json
from html import escape
from pathlib import Path
from typing import Any

from matrix.errors import ResultsFormatError

REQUIRED = ("config", "info", "parity_relerr", "blocks", "alone", "flags")


def load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ResultsFormatError(f"{path}: unreadable block file: {exc}") from exc
    if not isinstance(data, dict) or not all(k in data for k in REQUIRED):
        raise ResultsFormatError(f"{path}: not a decoder-block result (needs {', '.join(REQUIRED)})")
    return data


def _speedup(data: dict[str, Any], phase: str, variant: str) -> str:
    """opgate/<mode> vs torch/<mode>: "1.45x faster" or "3% slower"."""
    impl, mode = variant.split("/", 1)
    if impl != "opgate":
        return ""
    ours = data["blocks"][phase][variant]["median_us"]
    stock = data["blocks"][phase].get(f"torch/{mode}", {}).get("median_us")
    if not stock:
        return ""
    return f"{stock / ours:.2f}x faster" if ours <= stock else f"{100 * (ours / stock - 1):.0f}% slower"


def _provenance(data: dict[str, Any]) -> str:
    c, i = data["config"], data["info"]
    return (
        f"{i.get('device')} (sm_{str(i.get('capability', '?')).replace('.', '')}), torch {i.get('torch')}, "
        f"triton {i.get('triton')}, {str(i.get('date', '?'))[:10]}. Block: hidden {c['hidden']}, "
        f"{c['heads']} heads, seq {c['seq']}, batch {c['batch']}, ffn {c['ffn']}, {c['dtype']}, random "
        "weights (SDPA attention, RMSNorm, SwiGLU MLP, RoPE). Parity: max|out - ref| / max|ref| against "
        "the float32 block. Medians of interleaved runs."
    )


def _flags(data: dict[str, Any]) -> list[str]:
    if not data["flags"]:
        return ["No op is faster alone yet slower in the block."]
    return [f"**{f['flag']}**: {f['op']} ({f['mode']})" for f in data["flags"]]


def render_md(data: dict[str, Any]) -> str:
    lines = ["### Decoder block", "", _provenance(data), ""]
    lines += [
        "| variant/mode | relerr vs fp32 | forward us | vs stock | fwd+bwd us | vs stock |",
        "|---|---|---|---|---|---|",
    ]
    for key, err in data["parity_relerr"].items():
        fwd, stp = data["blocks"]["forward"][key], data["blocks"]["step"][key]
        lines.append(
            f"| {key} | {err:.2e} | {fwd['median_us']:.1f} | {_speedup(data, 'forward', key) or '–'} "
            f"| {stp['median_us']:.1f} | {_speedup(data, 'step', key) or '–'} |"
        )
    lines += ["", "Each op alone, on the inputs it gets inside the block (forward, median us):", ""]
    lines += ["| op | opgate | torch eager | torch compiled |", "|---|---|---|---|"]
    for op, t in data["alone"].items():
        cells = [f"{t[k]['median_us']:.1f}" if k in t else "–" for k in ("opgate", "torch", "torch-compile")]
        lines.append(f"| {op} | " + " | ".join(cells) + " |")
    return "\n".join([*lines, "", *_flags(data), ""])


def render_html(data: dict[str, Any]) -> str:
    """A section for index.html: the step-time bars per mode, then the parity/alone tables."""
    bars = []
    for phase, label in (("forward", "forward"), ("step", "forward + backward")):
        times = data["blocks"][phase]
        worst = max(v["median_us"] for v in times.values()) or 1.0
        rows = "".join(
            f'<tr><th scope="row">{escape(k)}</th><td><div class="bar" style="width:'
            f'{100 * v["median_us"] / worst:.1f}%"></div></td><td>{v["median_us"]:.1f} us '
            f"{escape(_speedup(data, phase, k))}</td></tr>"
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
    flags = "".join(f"<li>{escape(f.replace('**', ''))}</li>" for f in _flags(data))
    return (
        f"<p class='muted'>{escape(_provenance(data))}</p>{''.join(bars)}"
        "<h3>Parity (relerr vs float32)</h3><table>" + parity + "</table>"
        "<h3>Each op alone, inside-the-block inputs (forward, us)</h3>"
        "<table><tr><th>op</th><th>opgate</th><th>torch eager</th><th>torch compiled</th></tr>"
        + alone
        + f"</table><ul>{flags}</ul>"
    )
