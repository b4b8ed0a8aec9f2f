"""Perf figures: read them from cell results, keep their history, judge regressions.

Where the figures come from.  A GPU cell's ``perf`` check (validators/perf)
records, in ``details``::

    {"points": [{"shape": [32768, 8192],          # or "32768x8192"
                 "median_us": 267.0, "iqr_us": 3.1,
                 "samples_us": [...],             # per-repetition times
                 "gbps": 4021.0, "tflops": null,
                 "roofline_pct": 94.1,            # of the ceiling measured in the same run
                 "baseline": {"name": "aten", "median_us": 399.0, "gbps": 2690.0}}],
     "ceilings": {"copy_gbps": 4274.0}}

CPU cells record nothing (noise is not data), so a CPU-only run has no perf.

History.  compat.json keeps one series per (environment, cell, shape): the
environment key covers the GPU name and the fingerprint.  Each publish appends
a run; old runs keep their medians, only the newest few keep raw samples so the
file stays small.

Regressions (issue 8: never one threshold on one run).  The head's newest run
is compared with the base's newest runs (samples pooled across up to
``base_runs`` runs, which folds run-to-run noise into the reference): a
one-sided Mann-Whitney U test must reject "not slower" at ``alpha`` *and* the
median must have moved by at least ``min_effect``.  Without samples on both
sides nothing is judged.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from statistics import median
from typing import Any

from opgate.matrix.errors import ResultsFormatError
from opgate.validators.env import Fingerprint
from opgate.validators.perf.stats import judge, mann_whitney_u
from opgate.validators.perf.worth import FINDINGS
from opgate.validators.result import CellResult

PERF_CHECK = "perf"
HISTORY_LIMIT = 30
SAMPLES_KEPT = 3
#: Shortest ideal time (the shape's bytes and FLOPs at the run's measured ceilings) for which a
#: share of the roofline means anything.  Below it a launch costs more than the traffic: on the
#: H200, aten's rms_norm at 8x4096 takes 10.3 us for 0.03 us of bytes, so "0.3% of roofline"
#: would grade the launch, not the kernel.  Such points say "n/a (shape too small)".
MIN_ROOFLINE_US = 10.0


def shape_label(shape: Any) -> str:
    """``[32768, 8192]`` -> ``"32768x8192"``; a list of shapes joins with ``,``."""
    if isinstance(shape, str):
        return shape
    if isinstance(shape, (list, tuple)):
        if shape and all(isinstance(s, (list, tuple)) for s in shape):
            return ",".join(shape_label(s) for s in shape)
        return "x".join(str(int(d)) for d in shape)
    return str(shape)


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def shown(value: Any) -> str:
    """A JSON value as an error message quotes it (``null``, ``"fast"``, ``[null]``), cut to 40 characters."""
    text = json.dumps(value, default=repr)
    return text if len(text) <= 40 else text[:37] + "..."


def at(where: str, why: str) -> str:
    """A problem of ``where`` itself (``shapes[0] is 5, ...``) or of a field (``shapes[0].shape ...``)."""
    return f"{where} {why}" if why.startswith(("is ", "lacks ")) else f"{where}.{why}"


def number_problem(value: Any, *, positive: bool = False, nonnegative: bool = False) -> str | None:
    """Why ``value`` is not a finite number (above 0 when ``positive``, at least 0 when ``nonnegative``).

    The one test of a figure that a report divides by, compares or formats, shared by every
    reader of perf figures (bench tables, the decoder block, perf points, worth-it verdicts), so
    that a bad figure is refused where the file and field can still be named, not met later as a
    ``ZeroDivisionError`` or a format error.  JSON lets ``NaN``, ``Infinity`` and ``true`` through.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"is {shown(value)}, not a number"
    try:
        number = float(value)
    except OverflowError:
        return "is too large to be a figure"
    if not math.isfinite(number):
        return f"is {shown(value)}, not a finite number"
    if positive and number <= 0:
        return f"is {shown(value)}, not a number above 0"
    if nonnegative and number < 0:
        return f"is {shown(value)}, not a number of at least 0"
    return None


def ideal_us(point: Mapping[str, Any], ceilings: Mapping[str, Any]) -> float | None:
    """The point's time at the measured copy and GEMM ceilings (the slower of the two bounds)."""
    bounds = []
    nbytes, gbps = _num(point.get("bytes")), _num(ceilings.get("copy_gbps"))
    if nbytes is not None and gbps:
        bounds.append(nbytes / (gbps * 1e3))
    flops, tflops = _num(point.get("flops")), _num(ceilings.get("gemm_tflops"))
    if flops is not None and tflops:
        bounds.append(flops / (tflops * 1e6))
    return max(bounds) if bounds else None


def roofline_shown(record: Mapping[str, Any]) -> float | None:
    """The roofline share a report shows: ``None`` when unknown or the shape is too small to tell.

    A record from before ``ideal_us`` was kept shows its share as it was measured.
    """
    pct = _num(record.get("roofline_pct"))
    ideal = _num(record.get("ideal_us"))
    if pct is None or (ideal is not None and ideal < MIN_ROOFLINE_US):
        return None
    return pct


def _shape_problem(shape: Any) -> str | None:
    """Why ``shape`` cannot label a series: a string, a list of sizes, or a list of such lists."""
    if isinstance(shape, str):
        return None
    if not isinstance(shape, (list, tuple)):
        return f"is {shown(shape)}, not a shape (a string, or a list of sizes of at least 0)"
    if shape and all(isinstance(s, (list, tuple)) for s in shape):
        return next((why for why in map(_shape_problem, shape) if why), None)
    if all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        return None
    return f"is {shown(shape)}, not a shape (a string, or a list of sizes of at least 0)"


def point_problem(point: Any) -> str | None:
    """Why a perf point cannot go into the history, or None (field names as in the point).

    ``shape`` keys its series and the samples are the regression test's data, so a malformed
    one is refused rather than dropped: a skipped point is a run missing from the history with
    nothing to say so.  A median may be absent (it is then the samples'); if present it is
    a time above 0, as compat.json's schema requires.  The optional figures (``gbps``,
    ``roofline_pct``, ``baseline``...) are left out of the record when unusable, as before.
    """
    if not isinstance(point, Mapping):
        return f"is {shown(point)}, not an object"
    if "shape" in point and (why := _shape_problem(point["shape"])):
        return f"shape {why}"
    for key in ("median_us", "median_ms"):
        if point.get(key) is not None and (why := number_problem(point[key], positive=True)):
            return f"{key} {why}"
    for key in ("samples_us", "samples_ms"):
        samples = point.get(key)
        if samples is None:
            continue
        if not isinstance(samples, list):
            return f"{key} is {shown(samples)}, not an array of times"
        bad = next(
            ((i, why) for i, s in enumerate(samples) if (why := number_problem(s, nonnegative=True))), None
        )
        if bad:
            return f"{key}[{bad[0]}] {bad[1]}"
    return None


def details_problem(details: Mapping[str, Any]) -> str | None:
    """Why the perf check's ``details`` cannot feed the history (``points[i].field ...``), or None."""
    key = "points" if "points" in details else "shapes"
    points = details.get(key)
    if points is None:
        return None
    if not isinstance(points, list):
        return f"{key} is {shown(points)}, not an array"
    for i, point in enumerate(points):
        why = point_problem(point)
        if why:
            return at(f"{key}[{i}]", why)
    return None


def summary_problem(summary: Any) -> str | None:
    """Why a worth-it summary cannot be shown (``ratio is null, ...``), or None.

    ``finding`` orders the cells (the worst over dtypes is shown) and ``ratio`` and ``best``
    are printed, so all three must be what ``validators.perf.worth.cell_finding`` writes.
    """
    if not isinstance(summary, Mapping):
        return f"is {shown(summary)}, not an object"
    missing = [k for k in ("finding", "ratio", "best") if k not in summary]
    if missing:
        return f"lacks {', '.join(missing)}"
    if summary.get("finding") not in FINDINGS:
        return f"finding is {shown(summary.get('finding'))}, not one of {', '.join(FINDINGS)}"
    if why := number_problem(summary.get("ratio"), positive=True):
        return f"ratio {why}"
    if not isinstance(summary.get("best"), str):
        return f"best is {shown(summary.get('best'))}, not the name of a baseline"
    return None


def perf_problem(details: Mapping[str, Any], *, timed: bool = True) -> str | None:
    """Why a perf check's ``details`` cannot be published, as ``field ...``, or None.

    The perf points (:func:`details_problem`, read when the cell ran) and the worth-it
    summary; checked once, where a results or compat file is read (:func:`refuse_bad_perf`).
    """
    if timed and (why := details_problem(details)):
        return why
    record = details.get("worth_it")
    if record is None:
        return None
    if not isinstance(record, Mapping):
        return f"worth_it is {shown(record)}, not an object"
    if "summary" in record and record["summary"] is not None and (why := summary_problem(record["summary"])):
        return at("worth_it.summary", why)
    return None


def refuse_bad_perf(results: Iterable[CellResult], where: str) -> None:
    """Refuse a file whose perf records no report can use, naming it, the cell and the field.

    Called where a results file (:func:`reports.merge.read_runs`) or a compat file
    (:func:`reports.compat.from_document`) is read: every reader after that (the history,
    the worth-it table) takes the records as sound, before anything is written.
    """
    for result in results:
        check = result.check(PERF_CHECK)
        problem = perf_problem(check.details, timed=result.verdict.ran) if check is not None else None
        if problem:
            raise ResultsFormatError(f"{where}: cell {result.id}: perf check details.{problem}")


def _run_record(
    point: Mapping[str, Any], run: str, ceilings: Mapping[str, Any] | None = None
) -> dict[str, Any] | None:
    """Normalise one perf point; ``None`` when it carries no usable time."""
    med = _num(point.get("median_us"))
    if med is None and (ms := _num(point.get("median_ms"))) is not None:
        med = ms * 1000.0
    samples = point.get("samples_us")
    scale = 1.0
    if samples is None and point.get("samples_ms") is not None:
        samples, scale = point["samples_ms"], 1000.0
    clean = [v * scale for v in (_num(s) for s in samples or []) if v is not None]
    if med is None and clean:
        med = median(clean)
    if med is None:
        return None
    record: dict[str, Any] = {"run": run, "median_us": med}
    for name in ("iqr_us", "gbps", "tflops", "roofline_pct"):
        if (value := _num(point.get(name))) is not None:
            record[name] = value
    # validators.checks.perf records the share of the measured copy ceiling as ``pct_copy``
    if "roofline_pct" not in record and (pct := _num(point.get("pct_copy"))) is not None:
        record["roofline_pct"] = pct
    if (ideal := ideal_us(point, ceilings or {})) is not None:
        record["ideal_us"] = ideal
    if clean:
        record["samples_us"] = clean
    baseline = point.get("baseline")
    if isinstance(baseline, Mapping):
        record["baseline"] = {k: v for k, v in baseline.items() if k == "name" or _num(v) is not None}
    return record


def series_from_results(
    entries: Iterable[tuple[CellResult, str, Mapping[str, Any]]], run: str
) -> list[dict[str, Any]]:
    """Perf series (one run each) from (result, env_key, fingerprint) triples."""
    out = []
    for result, key, fingerprint in entries:
        check = result.check(PERF_CHECK)
        if check is None or not result.verdict.ran:
            continue
        points = check.details.get("points", check.details.get("shapes"))
        ceilings = check.details.get("ceilings")
        ceilings = ceilings if isinstance(ceilings, Mapping) else {}
        for point in points if isinstance(points, list) else []:
            if not isinstance(point, Mapping):
                continue
            record = _run_record(point, run, ceilings)
            if record is None:
                continue
            axes = result.cell.axes()
            out.append(
                {
                    "cell": result.id,
                    "env_key": key,
                    "gpu": Fingerprint.from_json(fingerprint).gpu_name or "",
                    "op": axes["op"],
                    "impl": axes["impl"],
                    "dtype": axes["dtype"],
                    "mode": axes["mode"],
                    "shape": shape_label(point.get("shape", "?")),
                    "runs": [record],
                }
            )
    return out


def series_key(series: Mapping[str, Any]) -> tuple[str, str, str]:
    return (str(series["env_key"]), str(series["cell"]), str(series["shape"]))


def with_history(
    new: Sequence[dict[str, Any]],
    old: Sequence[Mapping[str, Any]],
    limit: int = HISTORY_LIMIT,
    samples_kept: int = SAMPLES_KEPT,
) -> list[dict[str, Any]]:
    """Append each new run to its old series; series not re-measured are carried over."""
    merged: dict[tuple[str, str, str], dict[str, Any]] = {
        series_key(s): {**s, "runs": [dict(r) for r in s.get("runs", [])]} for s in old
    }
    for series in new:
        key = series_key(series)
        if key in merged:
            merged[key] = {**series, "runs": merged[key]["runs"] + list(series["runs"])}
        else:
            merged[key] = {**series, "runs": list(series["runs"])}
    result = []
    for key in sorted(merged):
        series = merged[key]
        runs = series["runs"][-limit:]
        for run in runs[:-samples_kept] if samples_kept else runs:
            run.pop("samples_us", None)
        result.append({**series, "runs": runs})
    return result


# --------------------------------------------------------------------------- regression rule


@dataclass(frozen=True)
class PerfRule:
    """The regression rule's parameters (recorded in every diff, so alerts are explainable)."""

    alpha: float = 0.01
    min_effect: float = 0.05
    min_samples: int = 5
    base_runs: int = SAMPLES_KEPT


@dataclass(frozen=True)
class PerfRegression:
    cell: str
    env_key: str
    gpu: str
    shape: str
    base_median_us: float
    head_median_us: float
    change: float  # relative, +0.10 = 10% slower
    p_value: float
    n_base: int
    n_head: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def mann_whitney_greater(head: Sequence[float], base: Sequence[float]) -> float:
    """One-sided p-value that ``head`` is stochastically greater (slower) than ``base``.

    The test itself lives in :func:`validators.perf.stats.mann_whitney_u` (exact for
    small samples, tie-corrected normal approximation otherwise): one rule, one place.
    """
    return mann_whitney_u(head, base).p_value


def _by_device(perf: Mapping[str, Any], environments: Mapping[str, Any]) -> dict[tuple[str, str, str], Any]:
    """Series keyed by (cell, device, shape): a dependency bump changes the env key, not the GPU."""
    out: dict[tuple[str, str, str], Any] = {}
    for series in perf.get("series", []):
        fingerprint = Fingerprint.from_json(environments.get(series["env_key"], {}))
        device = series.get("gpu") or fingerprint.gpu_name or "cpu"
        out[(series["cell"], device, series["shape"])] = series
    return out


def perf_regressions(
    base: Mapping[str, Any], head: Mapping[str, Any], rule: PerfRule | None = None
) -> list[PerfRegression]:
    """Regressions between two compat documents (see the module docstring for the rule)."""
    rule = rule or PerfRule()
    base_series = _by_device(base.get("perf") or {}, base.get("environments") or {})
    head_series = _by_device(head.get("perf") or {}, head.get("environments") or {})
    found = []
    common = sorted(set(base_series) & set(head_series))
    n_compared = max(1, len(common))  # Bonferroni over every series this diff compares
    for key in common:
        head_runs = head_series[key].get("runs") or []
        base_runs = base_series[key].get("runs") or []
        if not head_runs or not base_runs:
            continue
        newest = head_runs[-1]
        # Head carries base's history but was not re-measured.  Compared by content: run labels
        # are publish times, and two publishes can share a second.
        if newest in base_runs:
            continue
        head_samples = list(newest.get("samples_us") or [])
        base_samples = [s for r in base_runs[-rule.base_runs :] for s in r.get("samples_us") or []]
        verdict = judge(
            base_samples,
            head_samples,
            alpha=rule.alpha,
            min_effect=rule.min_effect,
            min_samples=rule.min_samples,
            n_comparisons=n_compared,
        )
        if verdict.regression:
            assert verdict.base_median_us is not None
            assert verdict.head_median_us is not None
            assert verdict.ratio is not None
            assert verdict.p_value is not None
            found.append(
                PerfRegression(
                    cell=key[0],
                    env_key=str(head_series[key]["env_key"]),
                    gpu=key[1],
                    shape=key[2],
                    base_median_us=verdict.base_median_us,
                    head_median_us=verdict.head_median_us,
                    change=verdict.ratio - 1.0,
                    p_value=verdict.p_value,
                    n_base=verdict.n_base,
                    n_head=verdict.n_head,
                )
            )
    return found
