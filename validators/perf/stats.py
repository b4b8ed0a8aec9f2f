"""The regression rule: is a new set of timings slower than history, beyond noise?

Why a rank test and an effect floor, never one threshold on one run: GPU
timings are skewed (a pre-empted repetition is 10x slower, never 10x faster)
and drift between sessions (clocks, temperature, allocation placement).  A
one-sided Mann-Whitney U test asks "are the new samples stochastically
larger?" without assuming a distribution and is blind to the size of outliers;
but with hundreds of samples per run it calls a 1% shift significant, so a
regression also needs the median to have moved by at least ``min_effect``
(5% by default).  ``alpha`` is Bonferroni-adjusted over the comparisons of one
diff, so a report comparing 300 cells does not raise 3 false alarms at 1%.

Pure Python (no torch, no numpy): reports import this on machines with
neither.  :func:`mann_whitney_u` is implemented here exactly — tie-corrected
normal approximation with continuity correction for larger samples, the exact
permutation distribution (ties included, via midranks) for small ones — so the
verdict does not depend on whether scipy is installed; the tests compare it
with scipy where scipy is present and with brute-force enumeration always.

Public API used by ``reports/diff.py``::

    judge(base_samples, head_samples, *, alpha=0.01, min_effect=0.05,
          n_comparisons=1, min_samples=5) -> PerfJudgement
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

#: Exact distribution when the product of the sample sizes is at most this (cheap, and
#: where the normal approximation is poorest); the approximation otherwise.
EXACT_MAX_PRODUCT = 400
ALPHA = 0.01
MIN_EFFECT = 0.05
MIN_SAMPLES = 5

Method = Literal["auto", "exact", "asymptotic"]


def median(values: Sequence[float]) -> float:
    """Median (mean of the middle two for even counts); ValueError on no data."""
    if not values:
        raise ValueError("median of no samples")
    s = sorted(values)
    mid = len(s) // 2
    return float(s[mid]) if len(s) % 2 else (s[mid - 1] + s[mid]) / 2.0


def quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default ``linear`` method)."""
    if not values:
        raise ValueError("quantile of no samples")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile q must be in [0, 1], got {q}")
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return float(s[lo] + (s[hi] - s[lo]) * (pos - lo))


def iqr(values: Sequence[float]) -> float:
    """Interquartile range: the spread reported next to every median."""
    return quantile(values, 0.75) - quantile(values, 0.25)


@dataclass(frozen=True)
class MannWhitney:
    """U statistic of the first sample (``x``) and the one-sided p-value that ``x`` is larger."""

    u: float
    p_value: float
    method: str  # "exact" | "asymptotic"


def _midranks(x: Sequence[float], y: Sequence[float]) -> tuple[list[float], list[int]]:
    """Midranks of x+y in input order, and the sizes of the tie groups."""
    pooled = sorted(range(len(x) + len(y)), key=lambda i: x[i] if i < len(x) else y[i - len(x)])
    values = [x[i] if i < len(x) else y[i - len(x)] for i in pooled]
    ranks = [0.0] * len(pooled)
    ties: list[int] = []
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[i]:
            j += 1
        for k in range(i, j + 1):
            ranks[pooled[k]] = (i + j) / 2.0 + 1.0
        ties.append(j - i + 1)
        i = j + 1
    return ranks, ties


def _subset_sums(ranks2: Sequence[int], n_pick: int) -> dict[int, int]:
    """How many ``n_pick``-subsets of ``ranks2`` have each sum.

    Ranks are doubled midranks (integers), so ties are handled exactly.  A
    dynamic programme over (items taken, rank sum) counts every subset once.
    """
    counts: list[dict[int, int]] = [{} for _ in range(n_pick + 1)]
    counts[0][0] = 1
    for r in ranks2:
        for k in range(n_pick - 1, -1, -1):
            nxt = counts[k + 1]
            for s, c in counts[k].items():
                nxt[s + r] = nxt.get(s + r, 0) + c
    return counts[n_pick]


def _exact_sf(ranks2: Sequence[int], nx: int, observed2: int) -> float:
    """P(rank sum of the first ``nx`` >= observed) over all ways to split the pooled ranks.

    The smaller side is enumerated (P(R_x >= r) = P(R_y <= total - r)) to keep the table small.
    """
    ny = len(ranks2) - nx
    hit: Callable[[int], bool]
    if nx <= ny:
        dist, hit = _subset_sums(ranks2, nx), lambda s: s >= observed2
    else:
        rest = sum(ranks2) - observed2
        dist, hit = _subset_sums(ranks2, ny), lambda s: s <= rest
    return sum(c for s, c in dist.items() if hit(s)) / sum(dist.values())


def mann_whitney_u(x: Sequence[float], y: Sequence[float], method: Method = "auto") -> MannWhitney:
    """One-sided Mann-Whitney U test of H1 "x is stochastically greater than y".

    ``U = R_x - n_x (n_x + 1) / 2`` (R_x: sum of x's midranks in the pooled
    sample).  ``exact``: the permutation distribution of R_x given the observed
    ranks (ties included).  ``asymptotic``: z = (U - n_x n_y / 2 - 1/2) / sigma
    with the tie-corrected sigma^2 = n_x n_y / 12 * ((N + 1) - sum(t^3 - t) /
    (N (N - 1))) — scipy's ``mannwhitneyu(x, y, alternative="greater",
    use_continuity=True, method="asymptotic")``.  ``auto``: exact when
    ``n_x * n_y <= EXACT_MAX_PRODUCT``.
    """
    nx, ny = len(x), len(y)
    if nx == 0 or ny == 0:
        raise ValueError(f"Mann-Whitney needs samples on both sides, got {nx} and {ny}")
    if any(not math.isfinite(v) for v in (*x, *y)):
        raise ValueError("Mann-Whitney samples must be finite numbers")
    ranks, ties = _midranks(x, y)
    rank_sum = sum(ranks[:nx])
    u = rank_sum - nx * (nx + 1) / 2.0
    if method == "auto":
        method = "exact" if nx * ny <= EXACT_MAX_PRODUCT else "asymptotic"
    if method == "exact":
        doubled = [round(2 * r) for r in ranks]
        return MannWhitney(u, _exact_sf(doubled, nx, round(2 * rank_sum)), "exact")
    if method != "asymptotic":
        raise ValueError(f"method must be auto, exact or asymptotic, got {method!r}")
    n = nx + ny
    tie_term = sum(t**3 - t for t in ties)
    variance = nx * ny / 12.0 * ((n + 1) - (tie_term / (n * (n - 1)) if n > 1 else 0.0))
    if variance <= 0:  # every value tied: no evidence either way
        return MannWhitney(u, 1.0, "asymptotic")
    z = (u - nx * ny / 2.0 - 0.5) / math.sqrt(variance)
    return MannWhitney(u, 0.5 * math.erfc(z / math.sqrt(2.0)), "asymptotic")


@dataclass(frozen=True)
class PerfJudgement:
    """Verdict of one (GPU, environment, cell, shape) comparison, with everything that explains it.

    ``ratio`` = head median / base median (1.10: 10% slower); ``regression`` is
    true only when ``p_value < alpha_adjusted`` *and* ``ratio >= 1 + min_effect``.
    ``reason`` says in one line why (or why it was not judged).
    """

    regression: bool
    judged: bool
    p_value: float | None
    ratio: float | None
    base_median_us: float | None
    head_median_us: float | None
    n_base: int
    n_head: int
    alpha: float
    alpha_adjusted: float
    min_effect: float
    method: str
    reason: str

    @property
    def change(self) -> float | None:
        """Relative change of the median (+0.10 = 10% slower)."""
        return None if self.ratio is None else self.ratio - 1.0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "change": self.change}


def judge(
    base_samples: Sequence[float],
    head_samples: Sequence[float],
    *,
    alpha: float = ALPHA,
    min_effect: float = MIN_EFFECT,
    n_comparisons: int = 1,
    min_samples: int = MIN_SAMPLES,
) -> PerfJudgement:
    """Is ``head`` (new timings, us) a regression against ``base`` (history, pooled over runs)?

    ``n_comparisons``: how many cells/shapes the caller compares in the same
    diff; alpha is divided by it (Bonferroni).  Fewer than ``min_samples`` on
    either side: not judged (``judged`` False, never a regression).
    """
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if min_effect < 0.0:
        raise ValueError(f"min_effect must be >= 0, got {min_effect}")
    if n_comparisons < 1:
        raise ValueError(f"n_comparisons must be >= 1, got {n_comparisons}")
    base = [float(v) for v in base_samples]
    head = [float(v) for v in head_samples]
    adjusted = alpha / n_comparisons
    if min(len(base), len(head)) < max(1, min_samples):
        return PerfJudgement(
            regression=False, judged=False, p_value=None, ratio=None, base_median_us=None,
            head_median_us=None, min_effect=min_effect, method="none",
            reason=f"not judged: {len(base)} base / {len(head)} head samples, need {min_samples} each",
            n_base=len(base), n_head=len(head), alpha=alpha, alpha_adjusted=adjusted,
        )  # fmt: skip
    base_med, head_med = median(base), median(head)
    ratio = head_med / base_med if base_med > 0 else math.inf
    test = mann_whitney_u(head, base)
    slower = test.p_value < adjusted
    big = ratio >= 1.0 + min_effect
    if slower and big:
        reason = f"{(ratio - 1) * 100:+.1f}% median, p={test.p_value:.2g} < {adjusted:.2g}"
    elif slower:
        reason = f"significant but small: {(ratio - 1) * 100:+.1f}% < {min_effect * 100:.0f}% floor"
    else:
        reason = f"not significant: p={test.p_value:.2g} >= {adjusted:.2g} ({(ratio - 1) * 100:+.1f}% median)"
    return PerfJudgement(
        regression=slower and big, judged=True, p_value=test.p_value, ratio=ratio,
        base_median_us=base_med, head_median_us=head_med, min_effect=min_effect,
        method=test.method, reason=reason, n_base=len(base), n_head=len(head), alpha=alpha,
        alpha_adjusted=adjusted,
    )  # fmt: skip
