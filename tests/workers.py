"""Helpers for tests that drive real worker processes (fork servers, warm servers)."""

from __future__ import annotations

import time
from typing import Any

from opgate.validators.workerproc import WorkerProcess


def wait_hello(worker: WorkerProcess, timeout_s: float = 60.0) -> dict[str, Any]:
    """The worker's hello message; fails with its log if it ends or stays silent first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for msg in worker.read():
            if msg.get("type") == "hello":
                return msg
        assert not worker.eof, worker.log.read_text()
        time.sleep(0.01)
    raise AssertionError(f"no hello from {worker.name} in {timeout_s:g} s")
