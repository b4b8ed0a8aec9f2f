"""Functions ``validators.forkchild`` runs in forked children, for its tests."""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any


def echo(arg: str) -> dict[str, Any]:
    return {
        "arg": json.loads(arg),
        "env": os.environ.get("FORK_TEST"),
        "pid": os.getpid(),
        "sid": os.getsid(0),
    }


def crash(arg: str) -> dict[str, Any]:
    os.kill(os.getpid(), signal.SIGSEGV)
    return {}


def hang(arg: str) -> dict[str, Any]:
    time.sleep(3600)
    return {}
