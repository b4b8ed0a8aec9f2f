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
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from opgate.matrix.errors import ResultsFormatError
from opgate.matrix.files import read_json
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
    """Why ``doc`` is not a :data:`FORMAT` document, or None."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        found = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        return f"format is {found!r}"
    for key in ("info", "ceilings", "timing", "cases"):
        if key not in doc:
            return f"missing {key!r}"
    for i, case in enumerate(doc["cases"]):
        missing = {"op", "label", "dtype", "direction", "results", "errors"} - set(case)
        if missing:
            return f"cases[{i}] lacks {', '.join(sorted(missing))}"
        bad = [n for n, r in case["results"].items() if r.get("role") not in ROLES]
        if bad:
            return f"cases[{i}]: results {', '.join(bad)} have no role of {', '.join(ROLES)}"
    return None


def shape_size(label: str) -> int:
    """Elements of a shape label (``"32768x8192"``, ``"4x4096x32x128 bhsd"``); flags of 0 are no dimension."""
    dims = [int(p) for p in label.split(maxsplit=1)[0].split("x") if p.isdigit()]
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
