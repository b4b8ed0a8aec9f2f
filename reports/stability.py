"""Verdict stability: the same cells run several times with fresh seeds must get the same verdicts.

``python -m opgate.reports.stability RUN_DIR RUN_DIR [...] --out DIR`` reads
each run's ``results.json`` and writes ``stability.json`` and ``stability.md``:
how many cells every run has, how many kept their verdict, and for each cell
that changed (or is missing from a run) its verdict, seed and reason per run.
It also lists the *closest calls*: the passing cells whose numbers came
nearest the tolerance bound (:func:`margin`, from the correctness and
gradients comparisons, worst over the runs), because a bound that verdicts
sit close to is one that flips on another seed.

Exit status: 0 every verdict identical, 1 some cell changed or is missing, 2
usage, 7 a ``results.json`` that cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opgate.matrix.errors import OpgateError
from opgate.validators.result import CellResult, RunResults

#: Checks whose comparisons carry tolerance margins.
NUMERIC_CHECKS = ("correctness", "gradients")
CLOSEST = 15


def margin(cell: CellResult) -> float | None:
    """Worst distance to the bound over the cell's numeric comparisons (None: none recorded).

    A comparison passes within ``allowed_ulps`` *or* within the absolute floor
    (``op_err <= allowed``, :mod:`validators.tolerance`), so its distance is the
    smaller of ``op_ulps / allowed_ulps`` and ``op_err / allowed``: a float32
    output at 0.98 of its ulp bound and a tenth of its absolute floor is not
    close to flipping.
    """
    worst: float | None = None
    for check in cell.checks:
        if check.name not in NUMERIC_CHECKS:
            continue
        for comp in check.details.get("comparisons") or []:
            allowed = comp.get("allowed_ulps")
            if not allowed or comp.get("problem") or comp.get("op_nonfinite"):
                continue
            ratio = float(comp.get("op_ulps", 0.0)) / float(allowed)
            floor = comp.get("allowed")
            if floor:
                ratio = min(ratio, float(comp.get("op_err", 0.0)) / float(floor))
            worst = ratio if worst is None else max(worst, ratio)
    return worst


@dataclass
class Stability:
    runs: list[str]
    cells: dict[str, list[CellResult | None]]

    @property
    def changed(self) -> dict[str, list[CellResult | None]]:
        return {
            cid: per_run
            for cid, per_run in self.cells.items()
            if None in per_run or len({c.verdict for c in per_run if c is not None}) > 1
        }

    def closest(self, n: int = CLOSEST) -> list[tuple[str, float]]:
        """The passing-everywhere cells nearest the tolerance bound, worst first."""
        found = []
        for cid, per_run in self.cells.items():
            if cid in self.changed or any(c.verdict.value != "pass" for c in per_run if c is not None):
                continue
            margins = [m for c in per_run if c is not None and (m := margin(c)) is not None]
            if margins:
                found.append((cid, max(margins)))
        return sorted(found, key=lambda item: -item[1])[:n]

    def to_json(self) -> dict[str, Any]:
        def record(c: CellResult | None) -> dict[str, Any] | None:
            if c is None:
                return None
            return {"verdict": c.verdict.value, "seed": c.seed, "reason": c.reason, "margin": margin(c)}

        changed = self.changed
        return {
            "runs": self.runs,
            "cells": len(self.cells),
            "identical": len(self.cells) - len(changed),
            "changed": len(changed),
            "changes": {cid: [record(c) for c in per_run] for cid, per_run in sorted(changed.items())},
            "verdicts": _counts(self),
            "closest_calls": [{"id": cid, "margin": m} for cid, m in self.closest()],
        }


def _counts(stab: Stability) -> list[dict[str, int]]:
    counts: list[dict[str, int]] = []
    for i in range(len(stab.runs)):
        tally: dict[str, int] = {}
        for per_run in stab.cells.values():
            c = per_run[i]
            if c is not None:
                tally[c.verdict.value] = tally.get(c.verdict.value, 0) + 1
        counts.append(dict(sorted(tally.items())))
    return counts


def compare(runs: Sequence[Path]) -> Stability:
    """Every cell id of any run, with its result per run (None where a run lacks it)."""
    results = [RunResults.read(Path(r) / "results.json") for r in runs]
    ids = sorted({c.id for r in results for c in r.cells})
    by_run = [{c.id: c for c in r.cells} for r in results]
    return Stability([str(r) for r in runs], {cid: [run.get(cid) for run in by_run] for cid in ids})


def markdown(stab: Stability) -> str:
    doc = stab.to_json()
    lines = [
        f"# Verdict stability over {len(stab.runs)} runs",
        "",
        f"{doc['identical']} of {doc['cells']} cells identical; {doc['changed']} changed.",
        "",
        "| run | " + " | ".join(f"`{r}`" for r in stab.runs) + " |",
        "|---|" + "---|" * len(stab.runs),
        "| verdicts | " + " | ".join(_tally(c) for c in doc["verdicts"]) + " |",
        "",
    ]
    if doc["changes"]:
        lines += [
            "## Changed cells",
            "",
            "| cell | " + " | ".join(f"run {i + 1}" for i in range(len(stab.runs))) + " |",
        ]
        lines.append("|---|" + "---|" * len(stab.runs))
        for cid, per_run in doc["changes"].items():
            cells = [
                "absent" if r is None else f"{r['verdict']} (seed {r['seed']}): {r['reason'][:120]}"
                for r in per_run
            ]
            lines.append(f"| `{cid}` | " + " | ".join(c.replace("|", "/") for c in cells) + " |")
        lines.append("")
    if doc["closest_calls"]:
        lines += ["## Closest calls (passing cells, worst distance to the bound over the runs)", ""]
        lines += [f"- `{c['id']}`: {c['margin']:.2f}" for c in doc["closest_calls"]]
        lines.append("")
    return "\n".join(lines)


def _tally(counts: dict[str, int]) -> str:
    return ", ".join(f"{v} {n}" for v, n in counts.items())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m opgate.reports.stability", description=__doc__.split("\n")[0]
    )
    parser.add_argument("runs", nargs="+", type=Path, help="run folders (each with a results.json)")
    parser.add_argument("--out", type=Path, required=True, help="where stability.json and stability.md go")
    args = parser.parse_args(argv)
    if len(args.runs) < 2:
        parser.error("give at least two run folders to compare")
    try:
        stab = compare(args.runs)
    except OpgateError as exc:
        print(f"opgate: {exc}", file=sys.stderr)
        return exc.exit_code
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "stability.json").write_text(json.dumps(stab.to_json(), indent=1) + "\n")
    text = markdown(stab)
    (args.out / "stability.md").write_text(text)
    print(text)
    return 1 if stab.changed else 0


if __name__ == "__main__":
    sys.exit(main())
