"""Print the zoo's verdict cases as cell ids for a GPU arch, one glob per line.

The zoo's expected verdicts (tests/test_zoo.py CASES) are device-independent,
except the cases marked for one device (cudagraphs cells run on GPUs only):
the same planted fault must get the same verdict from the same check on an
sm_90 GPU.  ``python -m tests.zoo.gpu_cases sm_90 13.0`` lists those cells so a
GPU runner can validate them with ``--select @file`` semantics (one per line),
and ``--expect`` prints ``id verdict check`` for comparing afterwards.
"""

from __future__ import annotations

import dataclasses
import sys

from tests.test_zoo import CASES


def main(argv: list[str]) -> int:
    arch, cuda = argv[0], argv[1]
    expect = "--expect" in argv
    for case in CASES:
        if case.device == "cpu":
            continue
        cell = dataclasses.replace(case.cell(), arch=arch, cuda=cuda)
        print(f"{cell.id} {case.verdict} {case.check or '-'}" if expect else cell.id)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
