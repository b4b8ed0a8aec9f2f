"""The worth-it verdict: real timings of real (small) CPU runs, and the rule's edges.

On CPU the perf check itself skips (GPU timings only); the row building and the
verdict are the same code, timed here with a host clock so the tests measure
something real: an op doing three times the reference's work must be found
slower, the reference against itself on par, and the reference against a
slowed copy faster.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import pytest
import torch

from opgate.ops.rms_norm.reference import rms_norm, sample_inputs
from opgate.validators.checks.perf_worth import worth_rows
from opgate.validators.perf.worth import FASTER, PAR, SLOWER, cell_finding, describe, judge_row


def host_timer(fns: Mapping[str, Callable[[], Any]], reps: int = 40) -> dict[str, list[float]]:
    """Interleaved host-clock samples (ABBA), like the GPU timer's schedule."""
    names = list(fns)
    for n in names:
        fns[n]()
    out: dict[str, list[float]] = {n: [] for n in names}
    for i in range(reps):
        for n in names if i % 2 == 0 else names[::-1]:
            t0 = time.perf_counter()
            fns[n]()
            out[n].append((time.perf_counter() - t0) * 1e6)
    return out


def _samples(shape: tuple[int, ...]) -> list[Any]:
    return [sample_inputs(shape, torch.float32, "cpu", torch.Generator().manual_seed(0))]


def _thrice(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """A correct op that does the work three times, forward and backward (a planted slow kernel)."""
    return (rms_norm(x, w, eps) + rms_norm(x, w, eps) + rms_norm(x, w, eps)) / 3


def _call(fn: Callable[..., Any]) -> Callable[[Any], Any]:
    return lambda s: fn(*s.args, **s.kwargs)


SHAPE = (64, 512)


def test_a_slow_op_is_found_slower_forward_and_backward() -> None:
    errors: list[str] = []
    fns = {"op": _call(_thrice), "reference": _call(rms_norm)}
    rows = worth_rows(fns, {SHAPE: _samples(SHAPE)}, host_timer, errors=errors)
    assert not errors
    assert [r["direction"] for r in rows] == ["forward", "forward+backward"]
    for row in rows:
        assert row["finding"] == SLOWER, row
        assert row["ratio"] > 1.5
        assert row["best"] == "reference"
    summary = cell_finding(rows)
    assert summary["finding"] == SLOWER
    assert describe(summary, "eager").startswith("eager: slower, ")


def test_the_reference_against_itself_is_on_par_and_against_a_slow_copy_faster() -> None:
    """A/A is on par; the op against a copy doing its work three times is faster.

    The A/A half times the same function twice on this (shared, 2-core) machine's
    host clock: one measurement in a few lands just past the 5% band when a
    neighbour's load shifts between the two, so it gets three tries, each of
    which must be par on every row to count.  The slow copy is 3x, yet one
    fresh-clone CI run timed the op's forward+backward at 14.2 ms against the
    copy's 7.4 ms (forward: 72 us against 249 us) while the machine was busy
    with other work: it gets three tries too, each of which must be faster on
    every row.  A classifier that cannot tell 3x apart fails all three.
    """
    errors: list[str] = []
    same = _tries(
        {"op": _call(rms_norm), "reference": _call(rms_norm)}, errors, lambda r: r["finding"] == PAR
    )
    assert all(r["finding"] == PAR for r in same[-1]), same
    fast = _tries({"op": _call(rms_norm), "slow": _call(_thrice)}, errors, lambda r: r["finding"] == FASTER)
    assert all(r["finding"] == FASTER for r in fast[-1]), fast
    assert cell_finding(fast[-1])["finding"] == FASTER


def _tries(
    impls: dict[str, Any],
    errors: list[str],
    holds: Callable[[dict[str, Any]], bool],
    check: Callable[[dict[str, Any]], None] = lambda r: None,
) -> list[list[dict[str, Any]]]:
    """Up to three timings of ``impls`` (``worth_rows``), until ``holds`` for every row of one.

    The host clock of this shared machine puts one measurement in a few out of line; a
    property that holds on none of three is the code's.  ``check`` asserts on every row.
    """
    tries: list[list[dict[str, Any]]] = []
    for _ in range(3):
        rows = worth_rows(impls, {SHAPE: _samples(SHAPE)}, host_timer, errors=errors)
        for r in rows:
            check(r)
        tries.append(rows)
        if all(holds(r) for r in rows):
            break
    return tries


def test_the_best_baseline_is_the_one_judged_against() -> None:
    """With a slow and a fast baseline, the op (= the fast one) is on par, not faster.

    Against the fast baseline the op is an A/A pair on this shared host clock, which one
    measurement in a few puts past the band (the op 16% under the same function, once):
    three tries, as in the A/A test above.  Judged against the 3x slow baseline instead,
    every try would be ``faster``.
    """
    errors: list[str] = []

    def best_is_fast(r: dict[str, Any]) -> None:
        assert r["best"] == "fast" or r["baselines_us"]["fast"] <= r["baselines_us"]["slow"], r

    impls = {"op": _call(rms_norm), "slow": _call(_thrice), "fast": _call(rms_norm)}
    tries = _tries(impls, errors, lambda r: r["finding"] != FASTER, best_is_fast)
    assert all(r["finding"] != FASTER for r in tries[-1]), tries


def test_a_baseline_that_raises_is_recorded_and_left_out() -> None:
    def broken(s: Any) -> Any:
        raise RuntimeError("no kernel for this shape")

    errors: list[str] = []
    rows = worth_rows(
        {"op": _call(rms_norm), "broken": broken, "reference": _call(rms_norm)},
        {SHAPE: _samples(SHAPE)},
        host_timer,
        errors=errors,
    )
    assert rows
    assert all("broken" not in r["baselines_us"] for r in rows)
    assert any("no kernel for this shape" in e for e in errors)


def test_rule_edges() -> None:
    base = [100.0 + (i % 7) for i in range(40)]
    assert judge_row([v * 1.03 for v in base], {"b": base})["finding"] == PAR  # within the 5% margin
    assert judge_row([v * 1.2 for v in base], {"b": base})["finding"] == SLOWER
    assert judge_row([v * 0.5 for v in base], {"b": base})["finding"] == FASTER
    noisy = judge_row([100.0, 400.0, 90.0, 110.0, 95.0], {"b": [100.0, 98.0, 105.0, 97.0, 101.0]})
    assert noisy["finding"] == PAR  # a 4x outlier moves no median
    with pytest.raises(ValueError, match="needs samples"):
        judge_row([], {"b": base})
    rows = [
        {"finding": FASTER, "ratio": 0.5, "best": "aten", "shape": [8, 4096], "direction": "forward"},
        {
            "finding": SLOWER,
            "ratio": 1.3,
            "best": "compile(reference)",
            "shape": [4096, 4096],
            "direction": "forward",
        },
        {
            "finding": SLOWER,
            "ratio": 2.0,
            "best": "compile(reference)",
            "shape": [32768, 8192],
            "direction": "forward",
        },
    ]
    worst = cell_finding(rows)
    assert (worst["finding"], worst["ratio"]) == (SLOWER, 2.0)
    assert worst["shape"] == [32768, 8192]
    assert describe(worst, "compile") == (
        "compile: slower, 2.00x the time of compile(reference) (32768x8192 forward)"
    )


def test_replay_check_compares_with_the_python_path_and_the_reference_and_catches_a_wrong_op() -> None:
    """opgate perf replay's per-case check on CPU (replay off here: Python vs Python, and the reference)."""
    from opgate.matrix.spec import load_specs
    from opgate.validators.perf.replay_check import check_op

    spec = load_specs()["rms_norm"]
    rows = check_op(spec, rms_norm, "triton", device="cpu", shapes=[(8, 64)])
    assert rows
    assert all(r["ok"] and r["same_forward"] and r["same_backward"] for r in rows), rows
    assert {r["layout"] for r in rows} >= {"contiguous", "transposed", "misaligned"}

    def wrong(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
        return rms_norm(x, w, eps) * 1.2  # planted: 20% off

    bad = check_op(spec, wrong, "cuda", device="cpu", shapes=[(8, 64)])
    assert bad
    assert not any(r["ok"] for r in bad)
    assert all(r["near_reference"] is False and "same_forward" not in r for r in bad)
