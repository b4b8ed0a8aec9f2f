"""Measured quality of the perf verdicts: false alarms (A/A) and a planted 10% slowdown.

A perf gate is only worth having if it rarely cries wolf and reliably catches
a real regression.  Both are measured here, on the GPU, with the very timing
path (:data:`validators.perf.timing.CHECK_TIMING`, op interleaved with its
reference) and regression rule (:func:`validators.perf.stats.judge`) the
matrix uses:

* a session = one fresh timing of the cell, as a nightly run does it: fresh
  random inputs in fresh allocations, its own warm-up and repetition count;
* ``history_runs`` unchanged sessions seed the history; then ``runs`` times an
  A/A session (the unchanged op) and a planted session
  (:class:`validators.perf.planted.Planted`) alternate.  Each is judged
  against the pooled samples of the latest ``history_runs`` unchanged
  sessions before it (reports keep samples of the newest 3 runs);
* bar (issue 8): at most 1 A/A alert in 20, at least 19 of 20 planted caught.
  Verdicts are also given at a Bonferroni factor of ``diff_cells`` (a diff
  over that many cells), which only makes alerts rarer.

The real slowdown of the planted copy is measured separately (interleaved
with the unchanged op, more repetitions) and reported next to the catch rate.
Sessions share one process (a fresh process per session would cost seconds of
start-up each); what differs between them is inputs, allocations and time.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from opgate.validators.perf.stats import judge, median
from opgate.validators.perf.timing import TimingConfig

UNCHANGED_KINDS = ("history", "aa")
#: The separate unchanged-vs-planted measurement: many repetitions, so its median is tight.
SLOWDOWN_TIMING = TimingConfig(rep_ms=300.0, max_reps=1000)


@dataclass(frozen=True)
class StudyConfig:
    op: str = "rms_norm"
    impl: str = "triton"
    dtype: str = "bf16"
    shapes: tuple[tuple[int, ...], ...] = ((8192, 8192),)
    runs: int = 20
    history_runs: int = 3
    slowdown: float = 0.10
    alpha: float = 0.01
    min_effect: float = 0.05
    diff_cells: int = 300
    seed: int = 0
    #: "cuda" on the GPU machine; tests drive the same path on "cpu" with host-clock events.
    device: str = "cuda"

    def __post_init__(self) -> None:
        if self.runs < 1 or self.history_runs < 1:
            raise ValueError(f"runs and history_runs must be >= 1, got {self.runs}, {self.history_runs}")
        if not self.shapes:
            raise ValueError("the study needs at least one shape")


@dataclass
class Session:
    """One timing session: its kind (history | aa | planted), index, and the op's samples."""

    kind: str
    index: int
    samples_us: list[float] = field(default_factory=list)
    baseline_us: list[float] = field(default_factory=list)
    clocks: dict[str, Any] = field(default_factory=dict)


def plan(config: StudyConfig) -> list[tuple[str, int]]:
    """Session order: the history seed, then A/A and planted alternating."""
    order = [("history", i) for i in range(config.history_runs)]
    for i in range(config.runs):
        order += [("aa", i), ("planted", i)]
    return order


def evaluate(sessions: Sequence[Session], config: StudyConfig) -> dict[str, Any]:
    """Judge every A/A and planted session against its rolling history; counts and per-run verdicts."""
    unchanged: list[Session] = []
    verdicts: list[dict[str, Any]] = []
    for s in sessions:
        if s.kind != "history":
            history = [v for h in unchanged[-config.history_runs :] for v in h.samples_us]
            one = judge(history, s.samples_us, alpha=config.alpha, min_effect=config.min_effect)
            many = judge(
                history, s.samples_us, alpha=config.alpha, min_effect=config.min_effect,
                n_comparisons=config.diff_cells,
            )  # fmt: skip
            verdicts.append({
                "kind": s.kind, "index": s.index, "median_us": median(s.samples_us),
                "n": len(s.samples_us), "ratio": one.ratio, "p_value": one.p_value,
                "alert": one.regression, "alert_bonferroni": many.regression, "reason": one.reason,
            })  # fmt: skip
        if s.kind in UNCHANGED_KINDS:
            unchanged.append(s)
    aa = [v for v in verdicts if v["kind"] == "aa"]
    planted = [v for v in verdicts if v["kind"] == "planted"]
    aa_ratios = [v["ratio"] for v in aa if v["ratio"] is not None]
    summary = {
        "aa_runs": len(aa),
        "aa_alerts": sum(v["alert"] for v in aa),
        "aa_alerts_bonferroni": sum(v["alert_bonferroni"] for v in aa),
        "aa_ratio_range": [min(aa_ratios), max(aa_ratios)] if aa_ratios else None,
        "planted_runs": len(planted),
        "planted_caught": sum(v["alert"] for v in planted),
        "planted_caught_bonferroni": sum(v["alert_bonferroni"] for v in planted),
    }
    summary["meets_bar"] = meets_bar(summary)
    return {"summary": summary, "verdicts": verdicts}


def meets_bar(summary: dict[str, Any]) -> bool:
    """Issue 8's bar, scaled to the run count: <= 1/20 A/A alerts, >= 19/20 planted caught."""
    aa_ok = summary["aa_alerts"] * 20 <= summary["aa_runs"]
    caught_ok = summary["planted_caught"] * 20 >= 19 * summary["planted_runs"]
    return bool(aa_ok and caught_ok)


# --------------------------------------------------------------------------- on the GPU


def _fns(config: StudyConfig) -> tuple[Any, Any, Any, dict[str, str]]:
    """(op, reference, sample_fn, cost) of the configured op/implementation, via its spec."""
    import importlib

    from opgate.matrix.spec import load_specs, resolve

    specs = load_specs()
    if config.op not in specs:
        raise ValueError(f"unknown op {config.op!r} (known: {', '.join(sorted(specs))})")
    spec = specs[config.op]
    if config.impl not in spec.implementations:
        raise ValueError(f"op {config.op!r} has no implementation {config.impl!r}")
    impl = spec.implementations[config.impl]
    importlib.import_module(impl.module)
    return (
        resolve(impl.entry, spec.root),
        resolve(spec.reference, spec.root),
        resolve(spec.samples, spec.root),
        spec.cost,
    )


def _slowdown_timing(op: Any, planted: Any, s: Any, device: str) -> dict[str, Any]:
    """Unchanged vs planted, interleaved with many repetitions: the real size of the slowdown."""
    from opgate.validators.perf.timing import time_interleaved

    return time_interleaved(
        {"unchanged": lambda: op(*s.args, **s.kwargs), "planted": lambda: planted(*s.args, **s.kwargs)},
        SLOWDOWN_TIMING,
        device,
    )


def _session(fn: Any, ref: Any, s: Any, device: str) -> dict[str, Any]:
    """One nightly-like timing: the op interleaved with its reference, as the perf check does it."""
    from opgate.validators.perf.timing import CHECK_TIMING, time_interleaved

    return time_interleaved(
        {"op": lambda: fn(*s.args, **s.kwargs), "baseline": lambda: ref(*s.args, **s.kwargs)},
        CHECK_TIMING,
        device,
    )


def _measure_shape(config: StudyConfig, shape: tuple[int, ...], fns: tuple[Any, ...]) -> dict[str, Any]:
    import torch

    from opgate.matrix.cost import shape_cost
    from opgate.ops.base import DTYPES
    from opgate.validators.perf.planted import Planted, extra_elements
    from opgate.validators.perf.timing import gpu_selector, read_clocks

    op, ref, sample_fn, cost = fns
    dtype = DTYPES[config.dtype]
    itemsize = torch.empty((), dtype=dtype).element_size()
    nbytes, _ = shape_cost(cost, shape, itemsize)
    numel = 1
    for d in shape:
        numel *= d
    if nbytes is None:
        raise ValueError(f"op {config.op!r} declares no cost.bytes: cannot size the planted slowdown")
    planted = Planted(op, extra_elements(nbytes, numel, itemsize, config.slowdown))
    selector = gpu_selector(0)

    def sample(seed: int) -> Any:
        return sample_fn(tuple(shape), dtype, config.device, torch.Generator().manual_seed(seed))

    ab = _slowdown_timing(op, planted, sample(config.seed), config.device)
    measured = ab["planted"].median_us / ab["unchanged"].median_us - 1.0
    sessions: list[Session] = []
    for n, (kind, index) in enumerate(plan(config)):
        timed = _session(
            planted if kind == "planted" else op, ref, sample(config.seed + 1 + n), config.device
        )
        sessions.append(
            Session(kind, index, timed["op"].samples_us, timed["baseline"].samples_us, read_clocks(selector))
        )
    result = evaluate(sessions, config)
    return {
        "shape": list(shape),
        "bytes": nbytes,
        "planted_extra_elements": planted.n_elements,
        "measured_slowdown": measured,
        "slowdown_timing": {k: v.summary() for k, v in ab.items()},
        **result,
        "sessions": [asdict(x) for x in sessions],
    }


def run_study(config: StudyConfig, out: Path) -> dict[str, Any]:
    """Run the study on the GPU and write ``out/study.json`` and ``out/study.md``."""
    from opgate.validators.perf.report import require_cuda, run_info, write_outputs

    if config.device.startswith("cuda"):
        require_cuda("opgate perf study")
    t0 = time.perf_counter()
    fns = _fns(config)
    info = run_info()
    shapes = [_measure_shape(config, tuple(shape), fns) for shape in config.shapes]
    data = {
        "config": asdict(config),
        "info": info,
        "shapes": shapes,
        "meets_bar": all(s["summary"]["meets_bar"] for s in shapes),
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    write_outputs(out, "study", data, markdown(data))
    return data


def markdown(data: dict[str, Any]) -> list[str]:
    from opgate.validators.perf.report import header, table

    cfg = data["config"]
    lines = header(f"Perf verdict quality: {cfg['op']}.{cfg['impl']} {cfg['dtype']}", data["info"])
    rule = (
        f"Rule: one-sided Mann-Whitney U, alpha {cfg['alpha']}, median change >= "
        f"{cfg['min_effect']:.0%}; history = samples of the latest {cfg['history_runs']} unchanged "
        f"runs. Bar: A/A alerts <= 1/20, planted caught >= 19/20. Wall time {data['wall_s']} s."
    )
    lines += [rule, ""]
    rows = []
    n = cfg["diff_cells"]
    for s in data["shapes"]:
        m = s["summary"]
        lo, hi = m["aa_ratio_range"] or (None, None)
        rows.append([
            "x".join(map(str, s["shape"])),
            f"{m['aa_alerts']}/{m['aa_runs']} ({m['aa_alerts_bonferroni']} at /{n})",
            f"{m['planted_caught']}/{m['planted_runs']} ({m['planted_caught_bonferroni']} at /{n})",
            f"{s['measured_slowdown']:+.1%} (planted {cfg['slowdown']:.0%})",
            "—" if lo is None or hi is None else f"{lo - 1:+.2%} .. {hi - 1:+.2%}",
            "yes" if m["meets_bar"] else "NO",
        ])  # fmt: skip
    lines += table(
        ["shape", "A/A alerts", "planted caught", "measured slowdown", "A/A median change", "meets bar"], rows
    )
    return lines
