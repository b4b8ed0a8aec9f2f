"""perf: how fast the op runs in this cell, against its reference, on a GPU.

Only GPU cells in ``eager``, ``compile`` and ``cudagraphs`` mode are timed.  On CPU the check
is a ``skip`` ("perf is measured on GPUs only") and records nothing: a shared
CI runner's timings are noise, and noise in the history makes false alarms.

Per shape of the cell's shape set, in the cell's layout: the op (the compiled
function in ``compile`` mode) and the spec's eager reference are timed
interleaved by :mod:`validators.perf.timing` (the cell override
``perf_baseline: compile`` compiles the reference too; off by default because
one more compilation per compile cell costs seconds, and ``python -m
validators.perf bench`` already times torch.compile of every reference).
Bytes and FLOPs from the spec's cost expressions turn the median into GB/s
and TFLOP/s, and the ceilings measured once per run
(:mod:`validators.perf.ceilings`) into percentages.
Every sample is kept: history and the regression rule
(:func:`validators.perf.stats.judge`) need distributions.

Worth it?  Every timed cell also records ``details["worth_it"]``: the op
against what PyTorch already gives in the cell's mode, forward and
forward+backward (:mod:`opgate.validators.checks.perf_worth`, rule in
:mod:`opgate.validators.perf.worth`); an op slower than that is a perf finding
in the summary and the compat report, never a ``fail``.

The status is ``pass`` whenever something was timed: perf never fails a cell
by itself; regressions are judged against history when reports diff runs.
``details`` (rendered by reports; keep the shape)::

    {"shapes": [{"shape", "samples_us", "median_us", "iqr_us", "bytes", "flops", "gbps",
                 "pct_copy", "tflops", "pct_gemm",
                 "baseline": {"name", "median_us", "samples_us"}}],
     "ceilings": {"copy_gbps", "gemm_tflops"}, "clocks": {"before", "after"}, "device": name}
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from opgate.matrix.modes import MODES as ALL_MODES
from opgate.validators.checks.base import Check, describe_exception
from opgate.validators.checks.context import CellContext
from opgate.validators.perf.worth import describe
from opgate.validators.result import CheckResult, Verdict

if TYPE_CHECKING:
    from opgate.validators.perf.timing import Timing

NAME = "perf"
#: Modes whose GPU cells are timed, and those that also record the op's own timing history
#: (``details["shapes"]``): :attr:`opgate.matrix.modes.Mode.timed` / ``perf_history``.
MODES = tuple(name for name, m in ALL_MODES.items() if m.timed)
HISTORY_MODES = tuple(name for name, m in ALL_MODES.items() if m.perf_history)
CPU_REASON = "perf is measured on GPUs only"
#: Written next to the cells' work folders, so every worker of one run shares the ceilings.
CEILINGS_FILE = "perf-ceilings.json"


def applies(ctx: CellContext) -> str | None:
    if ctx.device_kind != "cuda":
        return CPU_REASON
    if ctx.mode not in MODES:
        return f"perf is measured in {', '.join(MODES)} mode, not {ctx.mode}"
    if ctx.cell.layout == "zero_size":
        return "zero-size inputs move no data: nothing to time"
    if ctx.artifact is not None and ctx.artifact.failure is not None:
        return f"no {ctx.artifact.mode} artifact to time ({ctx.artifact.failure})"
    return None


def _rate(amount: float | None, median_us: float, scale: float) -> float | None:
    return None if amount is None or median_us <= 0 else amount / (median_us * 1e-6) / scale


def _pct(value: float | None, ceiling: float) -> float | None:
    return None if value is None or ceiling <= 0 else round(100.0 * value / ceiling, 2)


def _round(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


def _callables(ctx: CellContext) -> tuple[Any, Any, str]:
    """(op artifact, baseline callable taking a SampleInput, baseline name) for the cell's mode.

    The op is timed alone, against the spec's bare reference: the producer and
    consumer the cell's compiled graph holds (:mod:`validators.checks.opgraph`)
    are the context's cost, not the op's.
    """
    import torch

    from opgate.matrix.spec import resolve
    from opgate.validators.checks.artifacts import Artifact, Compiled

    op: Artifact
    if ctx.mode == "compile":
        op = Compiled(ctx.op, ctx.spec.dynamic_shapes, in_graph=False)
    else:
        op = ctx.artifact if ctx.artifact is not None else Artifact(ctx.op)
    ref, name = resolve(ctx.spec.reference, ctx.spec.root), "reference"
    if ctx.mode == "compile" and ctx.cell.override("perf_baseline") == "compile":
        ref = torch.compile(ref, dynamic=True if ctx.spec.dynamic_shapes else None)
        name = "compile(reference)"
    return op, (lambda s: ref(*s.args, **s.kwargs)), name


def time_shape(ctx: CellContext, shape: tuple[int, ...], op: Any, baseline: Any) -> dict[str, Any]:
    """Interleaved op/baseline timing of one shape, over rotated input copies where they fit in L2."""
    import torch

    from opgate.validators.perf.timing import (
        CHECK_TIMING,
        Rotating,
        input_bytes,
        rotation_count,
        time_interleaved,
    )

    first = ctx.inputs(shapes=[shape])[0]
    l2 = int(getattr(torch.cuda.get_device_properties(torch.device(ctx.device)), "L2_cache_size", 0))
    copies = rotation_count(input_bytes([first]), l2)
    samples = [first] + [ctx.inputs(shapes=[shape])[0] for _ in range(copies - 1)]
    fns = {
        "op": Rotating(op, [((s,), {}) for s in samples]),
        "baseline": Rotating(baseline, [((s,), {}) for s in samples]),
    }
    timed = time_interleaved(fns, CHECK_TIMING, torch.device(ctx.device))
    return {"op": timed["op"], "baseline": timed["baseline"], "rotated_copies": copies}


@contextlib.contextmanager
def honest_allocations() -> Iterator[None]:
    """Deterministic mode and NaN-filled allocations off while timing, restored afterwards.

    The cell runner keeps ``torch.empty`` NaN-filling for the whole cell (to
    catch unwritten outputs); timed under it, every output allocation would
    add a fill kernel and the op would look up to 50% slower than it is.
    """
    import torch
    import torch.utils.deterministic as det

    was_on = torch.are_deterministic_algorithms_enabled()
    was_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    was_fill = det.fill_uninitialized_memory  # type: ignore[attr-defined]
    torch.use_deterministic_algorithms(False)
    det.fill_uninitialized_memory = False  # type: ignore[attr-defined]
    try:
        yield
    finally:
        det.fill_uninitialized_memory = was_fill  # type: ignore[attr-defined]
        torch.use_deterministic_algorithms(was_on, warn_only=was_warn)


def shape_record(
    shape: tuple[int, ...],
    op: Timing,
    base: Timing,
    base_name: str,
    *,
    cost: tuple[float | None, float | None],
    ceilings: Mapping[str, float],
) -> dict[str, Any]:
    """One entry of ``details["shapes"]`` (the format reports render)."""
    nbytes, flops = cost
    gbps, tflops = _rate(nbytes, op.median_us, 1e9), _rate(flops, op.median_us, 1e12)
    return {
        "shape": list(shape),
        "samples_us": [round(s, 3) for s in op.samples_us],
        "median_us": round(op.median_us, 3),
        "iqr_us": round(op.iqr_us, 3),
        "bytes": nbytes,
        "flops": flops,
        "gbps": _round(gbps),
        "pct_copy": _pct(gbps, ceilings["copy_gbps"]),
        "tflops": _round(tflops, 3),
        "pct_gemm": _pct(tflops, ceilings["gemm_tflops"]),
        "baseline": {
            "name": base_name,
            "median_us": round(base.median_us, 3),
            "samples_us": [round(s, 3) for s in base.samples_us],
        },
    }


def run(ctx: CellContext) -> CheckResult:
    reason = applies(ctx)
    if reason is not None:
        return CheckResult(NAME, Verdict.SKIP, reason)
    import torch

    from opgate.validators.perf import ceilings as ceil_mod
    from opgate.validators.perf.timing import gpu_selector, read_clocks

    index = torch.device(ctx.device).index or 0
    selector = gpu_selector(index)
    clocks_before = read_clocks(selector)
    with honest_allocations():
        ceilings = ceil_mod.get(index, ctx.workdir.parent / CEILINGS_FILE)
        shapes, errors = _time_shapes(ctx, ceilings.brief()) if ctx.mode in HISTORY_MODES else ([], [])
        worth = _worth_it(ctx)
    details: dict[str, Any] = {
        "shapes": shapes,
        "worth_it": worth,
        "ceilings": ceilings.brief(),
        "clocks": {"before": clocks_before, "after": read_clocks(selector)},
        "device": ceilings.device,
    }
    errors += worth.get("errors", [])
    if errors:
        details["errors"] = errors
    if not shapes and not worth.get("rows"):
        return CheckResult(
            NAME, Verdict.SKIP, f"nothing timed: {errors[0] if errors else 'no rows'}", details
        )
    parts = [summarize(shapes)] if shapes else []
    if "summary" in worth:
        parts.append("worth it? " + describe(worth["summary"], ctx.mode))
    return CheckResult(NAME, Verdict.PASS, "; ".join(parts), details)


def _worth_it(ctx: CellContext) -> dict[str, Any]:
    """The worth-it record (:mod:`opgate.validators.checks.perf_worth`), timed with CUDA events."""
    import torch

    from opgate.validators.checks.perf_worth import worth_record
    from opgate.validators.perf.timing import CHECK_TIMING, time_interleaved

    device = torch.device(ctx.device)

    def timer(fns: Any) -> dict[str, list[float]]:
        return {n: t.samples_us for n, t in time_interleaved(fns, CHECK_TIMING, device).items()}

    try:
        return worth_record(ctx, timer)
    except Exception as exc:  # noqa: BLE001 - perf never fails a cell; the record says what broke
        return {"mode": ctx.mode, "rows": [], "errors": [f"worth-it: {describe_exception(exc)}"]}


def _time_shapes(ctx: CellContext, ceilings: Mapping[str, float]) -> tuple[list[dict[str, Any]], list[str]]:
    import torch

    from opgate.matrix.cost import CostError, shape_cost

    op, baseline, base_name = _callables(ctx)
    itemsize = torch.empty((), dtype=ctx.dtype).element_size()
    shapes: list[dict[str, Any]] = []
    errors: list[str] = []
    for shape in ctx.shapes:
        try:
            timed = time_shape(ctx, shape, op, baseline)
        except Exception as exc:  # noqa: BLE001 - an op crash is correctness's finding; perf records it
            errors.append(f"shape {list(shape)}: {describe_exception(exc)}")
            continue
        try:
            cost = shape_cost(ctx.spec.cost, shape, itemsize)
        except CostError as exc:
            cost = (None, None)
            errors.append(f"shape {list(shape)}: {exc}")
        record = shape_record(shape, timed["op"], timed["baseline"], base_name, cost=cost, ceilings=ceilings)
        shapes.append({**record, "rotated_copies": timed["rotated_copies"]})
    return shapes, errors


def summarize(shapes: list[dict[str, Any]]) -> str:
    """One line: the largest shape's median, bandwidth and speed against the baseline."""
    last = max(shapes, key=lambda s: s["bytes"] or 0)
    label = "x".join(str(d) for d in last["shape"])
    parts = [f"{label}: {last['median_us']:.1f} us"]
    if last["gbps"] is not None:
        parts.append(f"{last['gbps']:.0f} GB/s ({last['pct_copy']:.0f}% of copy)")
    base = last["baseline"]["median_us"]
    if base > 0 and last["median_us"] > 0:
        parts.append(f"{base / last['median_us']:.2f}x {last['baseline']['name']}")
    return ", ".join(parts)


CHECKS = (Check(NAME, applies, run),)
