"""A torch-free stand-in for ``validators.worker`` that speaks its protocol, for pool tests.

What it does with a cell is chosen by the cell's layout, so one pool run can
mix outcomes: ``contiguous`` passes (reporting the worker's environment),
``transposed`` aborts (SIGABRT), ``strided`` hangs, ``offset`` reports a
sticky device error, and ``fp16`` + ``misaligned`` fails its check.  A cell
whose shapes are ``sleep<seconds>`` takes that long (scheduling tests); one whose
shapes are ``built<seconds>`` first says what it builds is built (the ``built``
message of a build cell), then takes that long.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import time


def _reply(
    cell: dict[str, object], verdict: str, healthy: bool = True, reason: str = ""
) -> dict[str, object]:
    details: dict[str, object] = {
        k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "TRITON_INTERPRET", "OMP_NUM_THREADS")
    }
    details["pid"] = os.getpid()
    check = {"name": "probe", "status": verdict, "summary": f"{verdict} in {os.getpid()}", "details": details}
    return {
        "type": "result",
        "id": cell["id"],
        "outcome": {"checks": [check], "kernels": [], "reason": reason, "verdict": None},
        "duration_s": 0.01,
        "healthy": healthy,
    }


def main() -> None:
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    out.write(
        json.dumps({"type": "hello", "pid": os.getpid(), "startup_s": 0.0, "fingerprint": {"fake": True}})
    )
    out.write("\n")
    for line in sys.stdin:
        task = json.loads(line)
        cell = task["cell"]
        layout = cell["layout"]
        if layout == "transposed":
            os.abort()
        if layout == "strided":
            while True:
                time.sleep(3600)
        shapes = str(cell.get("shapes") or "")
        if shapes.startswith("built"):
            out.write(json.dumps({"type": "built", "id": cell["id"]}) + "\n")
        time.sleep(float(shapes[5:]) if shapes.startswith(("sleep", "built")) else 0.05)
        if layout == "offset":
            msg = _reply(
                cell, "error", healthy=False, reason="sticky CUDA error after this cell: illegal address"
            )
        elif layout == "misaligned" and cell["dtype"] == "fp16":
            msg = _reply(cell, "fail")
        else:
            msg = _reply(cell, "pass")
        out.write(json.dumps(msg) + "\n")
        if not msg["healthy"]:
            sys.exit(3)


if __name__ == "__main__":
    main()
