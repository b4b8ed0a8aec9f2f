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

from tests.zoo_cases import CASES


def check(results: Path, expected: list[tuple[str, str, str | None]]) -> int:
    """Print each expected case the run got otherwise (or did not run); 1 if any."""
    cells = {c["id"]: c for c in json.loads(results.read_text())["cells"]}
    wrong = 0
    for cell_id, verdict, check_name in expected:
        got = cells.get(cell_id)
        if got is None:
            print(f"MISSING {cell_id}")
            wrong += 1
            continue
        statuses = {c["name"]: c["status"] for c in got.get("checks", [])}
        if got["verdict"] != verdict or (check_name and statuses.get(check_name) != verdict):
            print(f"DIFFERS {cell_id}: expected {verdict} ({check_name or '-'}), got {got['verdict']}: "
                  f"{got.get('reason', '')[:300]}")  # fmt: skip
            wrong += 1
    print(f"zoo on GPU: {len(expected) - wrong}/{len(expected)} cases as expected")
    return 1 if wrong else 0


def main(argv: list[str]) -> int:
    arch, cuda = argv[0], argv[1]
    expected = []
    for case in CASES:
        if case.device == "cpu":
            continue
        cell = dataclasses.replace(case.cell(), arch=arch, cuda=cuda)
        expected.append((cell.id, case.verdict, case.check))
    if "--check" in argv:
        return check(Path(argv[argv.index("--check") + 1]), expected)
    for cell_id, verdict, check_name in expected:
        print(f"{cell_id} {verdict} {check_name or '-'}" if "--expect" in argv else cell_id)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
