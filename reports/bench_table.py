"""The one benchmark renderer: Markdown tables from ``bench.json`` documents.

Benchmarks run on the GPU machine (``opgate perf bench``, the one harness:
:mod:`validators.perf.bench`) and their JSON is committed; this module renders
it for ``opgate bench``, ``publish --bench`` (release notes, bench.md) and the
op inventory, and never measures anything.  One table per op and run; each row
is one (shape, dtype, direction); columns are the peers timed in the same run,
as microseconds and % of the device-to-device copy ceiling measured in that
run.  The best time of each row is bold, and a row where opgate is not the
fastest says by how much it trails — misses are shown, not hidden.

Who is "opgate" and who is a peer is recorded in the data (each result's
``role``: ``opgate``, ``variant`` or ``peer``), not guessed from names.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from opgate.matrix.errors import ResultsFormatError
from opgate.matrix.files import read_json
from opgate.reports.perf import number_problem, shown
from opgate.validators.perf.report import BENCH_FORMAT as FORMAT

ROLES = ("opgate", "variant", "peer")
DIRECTION_LABELS = {"forward": "fwd", "backward": "bwd", "forward+backward": "fwd+bwd"}
TITLE = "# opgate benchmark table"


def load(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Benchmark documents in the one format, in the order given; anything else is refused (exit 7)."""
    docs = []
    for path in paths:
        doc = read_json(Path(path), what="benchmark file")
        problem = format_problem(doc)
        if problem:
            raise ResultsFormatError(f"{path}: not a benchmark document ({FORMAT}): {problem}")
        docs.append(doc)
    return docs


def format_problem(doc: Any) -> str | None:
    """Why ``doc`` is not a :data:`FORMAT` document, or None.

    Every field the table later formats, compares or divides by is checked, where the message
    can still name the case and the field: a peer's ``median_us`` of 0 would divide by zero in
    :func:`verdict`, a null one break the row's ``min``, a text ``pct_copy`` its format.
    """
    return next(_problems(doc), None)


def _problems(doc: Any) -> Iterator[str]:
    """The document's problems in reading order; only the first is read (later checks may assume
    what earlier ones found: the generator is not resumed past a problem)."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        found = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        yield f"format is {found!r}"
    yield from (f"missing {key!r}" for key in ("info", "ceilings", "timing", "cases") if key not in doc)
    yield from (
        f"{key} is {shown(doc[key])}, not an object"
        for key in ("info", "ceilings", "timing")
        if not isinstance(doc[key], dict)
    )
    copy_gbps = doc["ceilings"].get("copy_gbps")
    if copy_gbps is not None and (why := number_problem(copy_gbps, nonnegative=True)):
        yield f"ceilings.copy_gbps {why}"
    if not isinstance(doc["cases"], list):
        yield f"cases is {shown(doc['cases'])}, not an array"
    for i, case in enumerate(doc["cases"]):
        if not isinstance(case, dict):
            yield f"cases[{i}] is {shown(case)}, not an object"
        missing = {"op", "label", "dtype", "direction", "results", "errors"} - set(case)
        if missing:
            yield f"cases[{i}] lacks {', '.join(sorted(missing))}"
        yield from (f"cases[{i}] ({_case_name(case)}): {why}" for why in _case_problems(case))
    unavailable = doc.get("unavailable")
    if unavailable is not None and not (
        isinstance(unavailable, dict) and all(isinstance(v, dict) for v in unavailable.values())
    ):
        yield "unavailable is not an object of op -> {implementation: why}"


def _case_name(case: Mapping[str, Any]) -> str:
    """``layer_norm 4096x4096 bf16 forward``: the case as a person finds it in the file."""
    return " ".join(str(case.get(k)) for k in ("op", "label", "dtype", "direction"))


def _case_problems(case: Mapping[str, Any]) -> Iterator[str]:
    """What in one case the table cannot use: the texts it prints, the times it divides by."""
    yield from (
        f"{k} is {shown(case[k])}, not a string"
        for k in ("op", "label", "dtype")
        if not isinstance(case[k], str)
    )
    if case["direction"] not in DIRECTION_LABELS:
        yield f"direction is {shown(case['direction'])}, not one of {', '.join(DIRECTION_LABELS)}"
    yield from (
        f"{k} is {shown(case[k])}, not an object"
        for k in ("results", "errors")
        if not isinstance(case[k], dict)
    )
    bad = [n for n, r in case["results"].items() if not isinstance(r, dict) or r.get("role") not in ROLES]
    if bad:
        yield f"results {', '.join(bad)} have no role of {', '.join(ROLES)}"
    for name, result in case["results"].items():
        if why := number_problem(result.get("median_us"), positive=True):
            yield f"results.{name}.median_us {why}"
        pct = result.get("pct_copy")
        if pct is not None and (why := number_problem(pct, nonnegative=True)):
            yield f"results.{name}.pct_copy {why}"


def shape_size(label: str) -> int:
    """Elements of a shape label (``"32768x8192"``, ``"4x4096x32x128 bhsd"``); flags of 0 are no dimension."""
    words = label.split(maxsplit=1) or [""]  # an empty label is a row of no known size, not a crash
    dims = [int(p) for p in words[0].split("x") if p.isdecimal()]
    return math.prod(d for d in dims if d > 0)


def _cell(result: Mapping[str, Any], best: float) -> str:
    text = f"{result['median_us']:.1f} us"
    if result.get("pct_copy") is not None:
        text += f" ({result['pct_copy']:.0f}%)"
    return f"**{text}**" if result["median_us"] <= best else text


def verdict(results: Mapping[str, Mapping[str, Any]]) -> str:
    """opgate's best against the best peer: ``fastest`` or ``N% slower`` (``–`` without both)."""
    ours = [r["median_us"] for r in results.values() if r["role"] == "opgate"]
    peers = [r["median_us"] for r in results.values() if r["role"] == "peer"]
    if not ours or not peers:
        return "–"
    ratio = min(ours) / min(peers)
    return "fastest" if ratio <= 1.0 else f"{100 * (ratio - 1):.0f}% slower"


def _provenance(doc: Mapping[str, Any]) -> str:
    info, ceilings = doc["info"], doc["ceilings"]
    arch = "sm_" + str(info.get("capability", "?")).replace(".", "")
    return (
        f"{info.get('device', '?')} ({arch}), torch {info.get('torch', '?')}, "
        f"triton {info.get('triton', '?')}, {str(info.get('date', '?'))[:10]}; "
        f"copy ceiling {ceilings.get('copy_gbps') or 0:.0f} GB/s. {doc['timing'].get('method', '')}"
    )


def _order(case: Mapping[str, Any]) -> tuple[int, str, str]:
    return shape_size(str(case["label"])), str(case["dtype"]), DIRECTION_LABELS[case["direction"]]


def render_op(doc: Mapping[str, Any], op: str) -> str:
    """One op's table from one run."""
    cases = sorted((c for c in doc["cases"] if c["op"] == op), key=_order)
    names: dict[str, str] = {}
    for case in cases:
        names.update({n: r["role"] for n, r in case["results"].items()})
    columns = sorted(names, key=lambda n: (names[n] == "peer", n))
    lines = [f"### {op}", "", _provenance(doc), ""]
    lines.append("| shape | dtype | dir | " + " | ".join(columns) + " | opgate vs best peer |")
    lines.append("|---|---|---|" + "---|" * len(columns) + "---|")
    for case in cases:
        results, direction = case["results"], DIRECTION_LABELS[case["direction"]]
        if not results:
            continue
        best = min(r["median_us"] for r in results.values())
        cells = [_cell(results[n], best) if n in results else "–" for n in columns]
        lines.append(f"| {' | '.join([case['label'], case['dtype'], direction, *cells, verdict(results)])} |")
    lines += [  # in the order they were measured
        f"\n- not timed: {n} {c['label']} {DIRECTION_LABELS[c['direction']]}: {why}"
        for c in doc["cases"]
        if c["op"] == op
        for n, why in c["errors"].items()
    ]
    left_out = (doc.get("unavailable") or {}).get(op) or {}
    lines += [f"\n- left out: {name}: {why}" for name, why in left_out.items()]
    return "\n".join(lines) + "\n"


def ops_of(doc: Mapping[str, Any]) -> list[str]:
    return sorted({str(c["op"]) for c in doc["cases"]})


def render(docs: list[dict[str, Any]]) -> str:
    """Every op of every document, by op name; a document's run is named above each of its tables."""
    head = [
        TITLE,
        "",
        (
            "Medians with the L2 flushed; % = share of the measured device-to-device copy bandwidth. "
            "Bold: the fastest in the row."
        ),
        "",
    ]
    sections = sorted(((op, i) for i, doc in enumerate(docs) for op in ops_of(doc)))
    return "\n".join(head) + "\n" + "\n".join(render_op(docs[i], op) for op, i in sections)
