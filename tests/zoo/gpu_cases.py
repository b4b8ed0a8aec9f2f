"""Print the zoo's verdict cases as cell ids for a GPU arch, one glob per line.

The zoo's expected verdicts (tests/zoo_cases.py CASES) are device-independent,
except the cases marked for one device (cudagraphs cells run on GPUs only):
the same planted fault must get the same verdict from the same check on an
sm_90 GPU.  ``python -m tests.zoo.gpu_cases sm_90 13.0`` lists those cells so a
GPU runner can validate them with ``--select @file`` semantics (one per line),
``--expect`` prints ``id verdict check``, and ``--check RESULTS`` compares a
run's ``results.json`` with the table: one line per case whose verdict (or whose
named check's status) differs, exit 1 if any does.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from tests.zoo_cases import CASES

#: Cases torch itself decides on a GPU: (op, mode, torch version prefix) -> (the verdict, what its
#: reason must say, the evidence that the failure is torch's without opgate); op ``*`` is any op.
#: A cell that matches is reported as KNOWN, not wrong; one that stops matching (a torch that
#: fixed it, another error) is a DIFFERS like any other, and the entry can go.
TORCH_BUGS: dict[tuple[str, str, str], tuple[str, str, str]] = {
    # a wrap_triton kernel's defaulted constexpr left out of the call (the zoo kernel's TWICE)
    ("zoo_triton_op", "compile", "2.11."): (
        "error",
        "launcher() missing 1 required positional argument: '_grid_2'",
        "results/runs/h200-triton-op-repro",
    ),
    # the same, met by AOTInductor's compile before anything is loaded
    ("zoo_triton_op", "aoti", "2.11."): (
        "fail",
        "launcher() missing 1 required positional argument: '_grid_2'",
        "results/runs/h200-triton-op-repro",
    ),
    # the H200 image's aoti_load_package dies with SIGSEGV for any package, the op's reference
    # through the same path included: the environment control says so
    ("*", "aoti", "2.11."): ("environment", "aoti is broken here", "results/runs/h200-aoti"),
}


def _torch_bug(got: dict[str, Any]) -> str | None:
    """Where the evidence is, when ``got`` is a case torch decides in its own torch (else None)."""
    axes = got.get("axes") or {}
    torch_version = str(axes.get("torch", ""))
    for (op, mode, prefix), (verdict, says, evidence) in TORCH_BUGS.items():
        same_op = op in ("*", axes.get("op"))
        same_case = same_op and axes.get("mode") == mode and torch_version.startswith(prefix)
        if same_case and got["verdict"] == verdict and says in got.get("reason", ""):
            return evidence
    return None


def check(results: Path, expected: list[tuple[str, str, str | None]]) -> int:
    """Print each expected case the run got otherwise (or did not run); 1 if any."""
    cells = {c["id"]: c for c in json.loads(results.read_text())["cells"]}
    wrong = known = 0
    for cell_id, verdict, check_name in expected:
        got = cells.get(cell_id)
        if got is None:
            print(f"MISSING {cell_id}")
            wrong += 1
            continue
        statuses = {c["name"]: c["status"] for c in got.get("checks", [])}
        if got["verdict"] != verdict or (check_name and statuses.get(check_name) != verdict):
            evidence = _torch_bug(got)
            if evidence is not None:
                torch_version = got["axes"]["torch"]
                print(f"KNOWN {cell_id}: {got['verdict']} from torch {torch_version} itself ({evidence}): "
                      f"{got.get('reason', '')[:200]}")  # fmt: skip
                known += 1
                continue
            print(f"DIFFERS {cell_id}: expected {verdict} ({check_name or '-'}), got {got['verdict']}: "
                  f"{got.get('reason', '')[:300]}")  # fmt: skip
            wrong += 1
    tail = f" ({known} of them decided by torch itself: KNOWN)" if known else ""
    print(f"zoo on GPU: {len(expected) - wrong}/{len(expected)} cases as expected{tail}")
    return 1 if wrong else 0


def main(argv: list[str]) -> int:
    arch, cuda = argv[0], argv[1]
    results = Path(argv[argv.index("--check") + 1]) if "--check" in argv else None
    # a run checked here may come from another machine's torch (the ids carry its version)
    ran = json.loads(results.read_text())["cells"] if results is not None else []
    torch_version = next((c["axes"]["torch"] for c in ran if "torch" in c.get("axes", {})), None)
    expected = []
    for case in CASES:
        if case.device == "cpu":
            continue
        cell = dataclasses.replace(case.cell(), arch=arch, cuda=cuda)
        if torch_version is not None:
            cell = dataclasses.replace(cell, torch=torch_version)
        expected.append((cell.id, case.verdict, case.check))
    if results is not None:
        return check(results, expected)
    for cell_id, verdict, check_name in expected:
        print(f"{cell_id} {verdict} {check_name or '-'}" if "--expect" in argv else cell_id)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
