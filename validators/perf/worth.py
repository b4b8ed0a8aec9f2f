"""Is this kernel worth it?  The op against what PyTorch already gives in the same mode.

A custom kernel that wins a micro-benchmark in eager mode can lose inside a
compiled model: Inductor fuses the stock op with its neighbours, while a custom
op is an opaque call between them (on the H200, opgate's RMSNorm is 1.5x faster
than aten alone in eager, and 2x slower than Inductor's code for
``F.rms_norm(x, w) * 2``).  So the perf check times, per mode, the op against the
baselines a team could ship instead:

* ``eager``: the spec's reference run eagerly, the stock aten op (when
  :data:`opgate.validators.perf.peers.ATEN` has one) and ``torch.compile`` of
  the reference;
* ``compile`` / ``cudagraphs``: ``torch.compile`` of the reference, both inside
  the same producer/consumer graph the correctness checks run the op in, and
  compiled the same way (``reduce-overhead`` for cudagraphs).

Each direction (``forward``, ``forward+backward``) and shape gives a row: the
op's median over the best baseline's median (``ratio``; above 1 is slower).
A row is ``slower`` only when the ratio exceeds ``1 + margin`` *and* a one-sided
Mann-Whitney U test on the interleaved samples says the op's times are larger
(so noise alone never flags it); ``faster`` symmetrically; ``par`` otherwise.
The cell's finding is its worst row.  It is a perf finding, reported beside the
correctness verdict, never a ``fail``.

Pure Python (no torch): reports import it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from opgate.validators.perf.stats import mann_whitney_u, median

MARGIN = 0.05
ALPHA = 0.01
DIRECTIONS = ("forward", "forward+backward")
SLOWER, PAR, FASTER = "slower", "par", "faster"
FINDINGS = (SLOWER, PAR, FASTER)


def judge_row(
    op_us: Sequence[float],
    baselines: Mapping[str, Sequence[float]],
    *,
    margin: float = MARGIN,
    alpha: float = ALPHA,
) -> dict[str, Any]:
    """One row: the best baseline, the op/best median ratio and the finding, from per-repetition samples."""
    if not op_us or not baselines or not all(baselines.values()):
        raise ValueError("judge_row needs samples of the op and of every baseline")
    medians = {name: median(s) for name, s in baselines.items()}
    best = min(medians, key=lambda n: medians[n])
    op_med = median(op_us)
    ratio = op_med / medians[best] if medians[best] > 0 else float("inf")
    finding = PAR
    if ratio > 1.0 + margin and mann_whitney_u(op_us, baselines[best]).p_value < alpha:
        finding = SLOWER
    elif ratio < 1.0 / (1.0 + margin) and mann_whitney_u(baselines[best], op_us).p_value < alpha:
        finding = FASTER
    return {
        "op_us": round(op_med, 3),
        "baselines_us": {n: round(m, 3) for n, m in medians.items()},
        "best": best,
        "ratio": round(ratio, 3),
        "finding": finding,
    }


def cell_finding(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The worst row (highest ratio among the most severe finding): what the cell reports."""
    if not rows:
        raise ValueError("no rows to judge")
    worst = max(rows, key=lambda r: (-FINDINGS.index(r["finding"]), r["ratio"]))
    return {
        "finding": worst["finding"],
        "ratio": worst["ratio"],
        "best": worst["best"],
        "shape": worst.get("shape"),
        "direction": worst.get("direction"),
    }


def describe(summary: Mapping[str, Any], mode: str) -> str:
    """One line, e.g. ``compile: slower, 2.05x the time of compile(reference) (32768x8192 forward)``."""
    where = ""
    if summary.get("shape") is not None:
        shape = summary["shape"]
        label = "x".join(str(d) for d in shape) if isinstance(shape, (list, tuple)) else str(shape)
        where = f" ({label} {summary.get('direction') or ''}".rstrip() + ")"
    return f"{mode}: {summary['finding']}, {summary['ratio']:.2f}x the time of {summary['best']}{where}"
