"""The decoder-block result as Markdown: parity, forward and step times with the speed-up over stock
PyTorch in the same mode, each op alone, and the "faster alone, slower in the block" flags.

One renderer for both places the table appears: ``block.md`` next to the
measurement (:mod:`validators.perf.block_run`) and the published report
(:mod:`reports.block_report`).  Torch-free: it reads ``block.json``'s data.
"""

from __future__ import annotations

from typing import Any


def speedup(data: dict[str, Any], phase: str, variant: str) -> str:
    """opgate/<mode> vs torch/<mode>: "1.45x faster" or "3% slower"."""
    impl, mode = variant.split("/", 1)
    if impl != "opgate":
        return ""
    ours = data["blocks"][phase][variant]["median_us"]
    stock = data["blocks"][phase].get(f"torch/{mode}", {}).get("median_us")
    if not stock:
        return ""
    return f"{stock / ours:.2f}x faster" if ours <= stock else f"{100 * (ours / stock - 1):.0f}% slower"


def provenance(data: dict[str, Any]) -> str:
    c, i = data["config"], data["info"]
    return (
        f"{i.get('device')} (sm_{str(i.get('capability', '?')).replace('.', '')}), torch {i.get('torch')}, "
        f"triton {i.get('triton')}, {str(i.get('date', '?'))[:10]}. Block: hidden {c['hidden']}, "
        f"{c['heads']} heads, seq {c['seq']}, batch {c['batch']}, ffn {c['ffn']}, {c['dtype']}, random "
        "weights (SDPA attention, RMSNorm, SwiGLU MLP, RoPE). Parity: max|out - ref| / max|ref| against "
        "the float32 block. Medians of interleaved runs."
    )


def flags(data: dict[str, Any]) -> list[str]:
    if not data["flags"]:
        return ["No op is faster alone yet slower in the block."]
    return [f"**{f['flag']}**: {f['op']} ({f['mode']})" for f in data["flags"]]


def render_md(data: dict[str, Any]) -> str:
    lines = ["### Decoder block", "", provenance(data), ""]
    lines += [
        "| variant/mode | relerr vs fp32 | forward us | vs stock | fwd+bwd us | vs stock |",
        "|---|---|---|---|---|---|",
    ]
    for key, err in data["parity_relerr"].items():
        fwd, stp = data["blocks"]["forward"][key], data["blocks"]["step"][key]
        lines.append(
            f"| {key} | {err:.2e} | {fwd['median_us']:.1f} | {speedup(data, 'forward', key) or '–'} "
            f"| {stp['median_us']:.1f} | {speedup(data, 'step', key) or '–'} |"
        )
    lines += ["", "Each op alone, on the inputs it gets inside the block (forward, median us):", ""]
    lines += ["| op | opgate | torch eager | torch compiled |", "|---|---|---|---|"]
    for op, t in data["alone"].items():
        cells = [f"{t[k]['median_us']:.1f}" if k in t else "–" for k in ("opgate", "torch", "torch-compile")]
        lines.append(f"| {op} | " + " | ".join(cells) + " |")
    return "\n".join([*lines, "", *flags(data), ""])
