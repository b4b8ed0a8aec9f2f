"""Convert benchmark files of the retired per-op scripts into the one benchmark format.

Before ``opgate perf bench`` was the only harness, each ``ops/<op>/bench.py``
wrote ``{"meta", "op", "rows"}`` with free-text implementation labels
(``"aten F.rms_norm"``, ``"opgate triton, compiled"``), ``fwd``/``bwd`` and
``host-*`` rows.  The committed H200 results (results/runs/h200-bench/) were
converted with this module; it is kept so anyone holding such files can do the
same::

    python -m opgate.reports.bench_legacy OLD.json [...] --out DIR   # DIR/<op>.json per input

Nothing is re-measured or re-derived except the byte count, which the old rows
carried only as GB/s x time: medians, % of copy and failures are copied as
recorded; a ``host-*`` row becomes its implementation's ``host_us``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from opgate.matrix.errors import OpgateError, ResultsFormatError
from opgate.validators.perf.report import BENCH_FORMAT as FORMAT

DIRECTIONS = {"fwd": "forward", "bwd": "backward"}


def peer_of(label: str) -> tuple[str, str]:
    """(column name, role) of an old implementation label, the names ``opgate perf bench`` uses."""
    low = " ".join(label.lower().replace(",", " ").split())
    if low.startswith("opgate "):
        name = "opgate-" + low.removeprefix("opgate ").replace(" ", "-")
        return name, "variant" if name.endswith("-compiled") else "opgate"
    for family in ("aten", "liger"):
        if low.startswith(family):
            return family, "peer"
    if low in ("compile(reference)", "eager reference"):
        return low.replace("eager reference", "eager(reference)"), "peer"
    raise ResultsFormatError(f"unknown implementation label {label!r}")


def _shape(label: str) -> list[int]:
    return [int(d) for d in label.split(maxsplit=1)[0].split("x")]


def convert(doc: Mapping[str, Any]) -> dict[str, Any]:
    """One old document (one op) as a :data:`~reports.bench_table.FORMAT` document."""
    if not isinstance(doc, Mapping) or not {"meta", "op", "rows"} <= doc.keys():
        raise ResultsFormatError("not a per-op benchmark document (needs meta, op, rows)")
    meta, copy_gbps = doc["meta"], float(doc["meta"]["copy_gbps"])
    cases: dict[tuple[str, str, str], dict[str, Any]] = {}
    host: list[tuple[dict[str, Any], str, str]] = []
    for row in doc["rows"]:
        kind = str(row["direction"])
        name, role = peer_of(str(row["impl"]))
        key = (str(row["shape"]), str(row["dtype"]), DIRECTIONS[kind.removeprefix("host-")])
        case = cases.setdefault(key, _case(str(doc["op"]), *key))
        if kind.startswith("host-"):
            host.append((case, name, row.get("host_us")))
        elif isinstance(row.get("us"), (int, float)):
            case["results"][name] = _result(row, role)
            case["bytes"] = case["bytes"] or round(row["gbps"] * 1e9 * row["us"] * 1e-6)
        else:
            case["errors"][name] = str(row.get("error", "not timed"))
    for case, name, us in host:
        if name in case["results"] and isinstance(us, (int, float)):
            case["results"][name]["host_us"] = us
    return {
        "format": FORMAT,
        "info": {
            "device": meta.get("device"), "capability": str(meta.get("capability", "")).removeprefix("sm_"),
            "torch": meta.get("torch"), "triton": meta.get("triton"), "python": meta.get("python"),
            "date": meta.get("date"),
        },
        "ceilings": {"copy_gbps": copy_gbps, "gemm_tflops": None},
        "timing": {"method": meta.get("method", "")},
        "cases": list(cases.values()),
        "unavailable": {},
        "wall_s": None,
        "converted_from": "ops/<op>/bench.py (retired)",
    }  # fmt: skip


def _case(op: str, label: str, dtype: str, direction: str) -> dict[str, Any]:
    return {
        "op": op, "shape": _shape(label), "label": label, "dtype": dtype, "direction": direction,
        "context": None, "bytes": None, "results": {}, "errors": {},
    }  # fmt: skip


def _result(row: Mapping[str, Any], role: str) -> dict[str, Any]:
    return {
        "role": role, "median_us": row["us"], "iqr_us": None, "n": None,
        "gbps": row.get("gbps"), "pct_copy": row.get("pct_copy"),
    }  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m opgate.reports.bench_legacy", description=__doc__)
    parser.add_argument("inputs", nargs="+", type=Path, metavar="OLD.json")
    parser.add_argument("--out", type=Path, required=True, metavar="DIR")
    args = parser.parse_args(argv)
    try:
        for path in args.inputs:
            try:
                converted = convert(json.loads(path.read_text()))
            except (OSError, json.JSONDecodeError, KeyError, ValueError) as exc:
                raise ResultsFormatError(f"{path}: {exc}") from exc
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / path.name).write_text(json.dumps(converted, indent=1) + "\n")
    except OpgateError as err:
        print(f"bench_legacy: {err}", file=sys.stderr)
        return err.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
