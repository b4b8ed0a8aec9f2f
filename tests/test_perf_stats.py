"""The regression rule (validators.perf.stats): Mann-Whitney exactness, and the rule's error rates.

Mann-Whitney is checked three ways: against scipy's published values (pinned
below, from scipy 1.17.1), against brute-force enumeration of every split of
the pooled sample (the definition of the exact test, ties included), and
against a live scipy when one is installed.  The rule is then exercised on
synthetic timings shaped like GPU samples (log-normal noise, rare slow
outliers, run-to-run drift): unchanged runs rarely alert, a 10% slowdown is
caught, a significant-but-small shift is not a regression.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics

import pytest

from opgate.validators.perf.stats import Method, iqr, judge, mann_whitney_u, median, quantile

# (x, y, method, U, p) from scipy.stats.mannwhitneyu(x, y, alternative="greater", use_continuity=True)
SCIPY_VALUES = [
    ([3.1, 4.2, 5.0, 6.3, 7.7], [1.0, 2.2, 3.0, 4.1], "exact", 19.0, 0.015873015873015872),
    ([5.5, 6.1, 7.2], [1.0, 2.0, 3.0, 4.0], "exact", 12.0, 0.02857142857142857),
    (
        [1, 2, 2, 3, 3, 3, 4, 5, 5, 6, 7, 7, 8],
        [1, 1, 2, 3, 4, 4, 4, 5, 6],
        "asymptotic",
        72.5,
        0.181336374526681,
    ),
    (
        [10.2, 10.5, 10.1, 10.9, 11.3, 10.8, 10.4, 10.7, 11.0, 10.6],
        [10.0, 10.3, 9.8, 10.1, 10.2, 9.9, 10.4, 10.0, 9.7, 10.5],
        "asymptotic",
        90.0,
        0.001387835210035933,
    ),
]


@pytest.mark.parametrize(("x", "y", "method", "u", "p"), SCIPY_VALUES)
def test_mann_whitney_matches_scipy_values(
    x: list[float], y: list[float], method: Method, u: float, p: float
) -> None:
    result = mann_whitney_u(x, y, method)
    assert result.u == u
    assert result.p_value == pytest.approx(p, rel=1e-12)
    assert result.method == method


def _brute_force_p(x: list[float], y: list[float]) -> float:
    """P(U >= observed) over every assignment of the pooled values to x (the exact test's definition)."""
    pooled = x + y

    def u_of(xs: list[float], ys: list[float]) -> float:
        return sum(1.0 if a > b else 0.5 if a == b else 0.0 for a in xs for b in ys)

    observed = u_of(x, y)
    hits = total = 0
    for idx in itertools.combinations(range(len(pooled)), len(x)):
        chosen = set(idx)
        xs = [pooled[i] for i in idx]
        ys = [pooled[i] for i in range(len(pooled)) if i not in chosen]
        total += 1
        hits += u_of(xs, ys) >= observed - 1e-9
    return hits / total


@pytest.mark.parametrize("seed", range(12))
def test_exact_p_equals_enumeration_with_ties(seed: int) -> None:
    rng = random.Random(seed)
    nx, ny = rng.randint(1, 6), rng.randint(1, 6)
    # coarse values force ties, which the exact path must handle via midranks
    x = [float(rng.randint(0, 5)) for _ in range(nx)]
    y = [float(rng.randint(0, 4)) for _ in range(ny)]
    result = mann_whitney_u(x, y, "exact")
    assert result.p_value == pytest.approx(_brute_force_p(x, y), abs=1e-12)
    assert result.u == pytest.approx(sum(1.0 if a > b else 0.5 if a == b else 0.0 for a in x for b in y))


def test_exact_uses_the_smaller_side_consistently() -> None:
    x = [float(v) for v in range(30, 60)]  # 30 values against 3: enumerated from y's side
    y = [1.0, 45.5, 70.0]
    assert mann_whitney_u(x, y, "exact").p_value == pytest.approx(
        1.0 - mann_whitney_u(y, x, "exact").p_value + _p_equal(x, y), abs=1e-12
    )


def _p_equal(x: list[float], y: list[float]) -> float:
    """P(U_x == observed) without ties = P(U_x >= u) + P(U_x <= u) - 1, via the two tails."""
    from opgate.validators.perf.stats import _exact_sf, _midranks

    ranks, _ = _midranks(x, y)
    doubled = [round(2 * r) for r in ranks]
    rank_sum = round(2 * sum(ranks[: len(x)]))
    ge = _exact_sf(doubled, len(x), rank_sum)
    gt = _exact_sf(doubled, len(x), rank_sum + 1)
    return ge - gt


def test_live_scipy_agrees_when_installed() -> None:
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = random.Random(7)
    for _ in range(200):
        x = [rng.gauss(0.2, 1.0) for _ in range(rng.randint(1, 12))]
        y = [rng.gauss(0.0, 1.0) for _ in range(rng.randint(1, 12))]
        for method in ("exact", "asymptotic"):
            ref = scipy_stats.mannwhitneyu(x, y, alternative="greater", method=method)
            assert mann_whitney_u(x, y, method).p_value == pytest.approx(float(ref.pvalue), abs=1e-12)


def test_mann_whitney_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="both sides"):
        mann_whitney_u([], [1.0])
    with pytest.raises(ValueError, match="finite"):
        mann_whitney_u([1.0, math.nan], [1.0])
    with pytest.raises(ValueError, match="method"):
        mann_whitney_u([1.0], [2.0], "bootstrap")  # type: ignore[arg-type]
    assert mann_whitney_u([3.0, 3.0], [3.0, 3.0], "asymptotic").p_value == 1.0


def test_median_quantile_iqr_match_the_standard_library() -> None:
    rng = random.Random(3)
    data = [rng.lognormvariate(0, 0.3) for _ in range(101)]
    assert median(data) == statistics.median(data)
    assert median([4.0, 1.0, 3.0, 2.0]) == 2.5
    q1, _, q3 = statistics.quantiles(data, n=4, method="inclusive")
    assert quantile(data, 0.25) == pytest.approx(q1)
    assert iqr(data) == pytest.approx(q3 - q1)
    with pytest.raises(ValueError, match="no samples"):
        median([])


# --------------------------------------------------------------------------- the rule on GPU-like data


def _run(rng: random.Random, base_us: float, n: int = 60, drift: float = 0.01) -> list[float]:
    """One timing session: a run-level drift, log-normal jitter, 2% slow outliers."""
    level = base_us * (1.0 + rng.uniform(-drift, drift))
    out = []
    for _ in range(n):
        t = level * rng.lognormvariate(0.0, 0.02)
        if rng.random() < 0.02:
            t *= rng.uniform(1.5, 4.0)
        out.append(t)
    return out


def test_unchanged_runs_rarely_alert() -> None:
    rng = random.Random(11)
    history = [_run(rng, 70.0) for _ in range(3)]
    alerts = 0
    for _ in range(100):
        new = _run(rng, 70.0)
        alerts += judge([v for r in history[-3:] for v in r], new).regression
        history.append(new)
    assert alerts <= 1


def test_ten_percent_slowdown_is_caught() -> None:
    rng = random.Random(12)
    caught = 0
    for _ in range(40):
        base = [v for _ in range(3) for v in _run(rng, 70.0)]
        verdict = judge(base, _run(rng, 77.0), n_comparisons=300)
        caught += verdict.regression
    assert caught >= 39


def test_effect_floor_separates_significant_from_regression() -> None:
    rng = random.Random(13)
    base = [70.0 * rng.lognormvariate(0, 0.005) for _ in range(500)]
    head = [72.1 * rng.lognormvariate(0, 0.005) for _ in range(500)]  # +3%: clear, but small
    verdict = judge(base, head)
    assert verdict.p_value is not None
    assert verdict.p_value < 1e-10
    assert not verdict.regression
    assert "small" in verdict.reason
    assert judge(base, head, min_effect=0.02).regression


def test_bonferroni_divides_alpha() -> None:
    base = [10.0, 10.1, 10.2, 10.3, 10.4, 10.5]
    head = [11.0, 11.2, 11.1, 11.3, 10.45, 11.4]
    single = judge(base, head)
    assert single.regression
    assert single.p_value is not None
    many = judge(base, head, n_comparisons=1000)
    assert many.alpha_adjusted == pytest.approx(1e-5)
    assert not many.regression
    assert single.p_value > 1e-5


def test_faster_is_never_a_regression_and_too_few_samples_are_not_judged() -> None:
    assert not judge([10.0] * 10, [5.0] * 10).regression
    few = judge([1.0, 2.0], [3.0, 4.0, 5.0, 6.0, 7.0])
    assert not few.judged
    assert not few.regression
    assert "not judged" in few.reason
    for bad in ({"alpha": 0.0}, {"min_effect": -0.1}, {"n_comparisons": 0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            judge([1.0] * 5, [1.0] * 5, **bad)


def test_judgement_json_carries_its_explanation() -> None:
    data = judge([10.0] * 8, [12.0, 12.5, 12.2, 12.1, 12.9, 12.3, 12.4, 12.6]).to_json()
    assert data["regression"] is True
    assert data["change"] == pytest.approx(data["ratio"] - 1.0)
    assert {"p_value", "alpha_adjusted", "min_effect", "n_base", "n_head", "method", "reason"} <= set(data)
