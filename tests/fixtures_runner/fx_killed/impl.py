"""Planted fault: the first process to run the op is killed from outside while the op runs.

``OPGATE_FX_KILL_MARKER`` names a marker file, ``OPGATE_FX_KILL`` who dies:

* ``worker``: the op writes its pid into the marker and waits; the test sends
  that pid a real SIGKILL (what the OOM killer does);
* ``forkserver``: the op SIGKILLs its parent, the fork server it was forked
  from; the kernel then kills the op's worker too (PR_SET_PDEATHSIG).

Any later process (the re-run, in a fresh worker) finds the marker taken and
computes ``2 * x``: the re-run passes, and the runner must still report
``error`` naming the kill, never ``flaky``.  Without the variables the op is
simply correct.
"""

from __future__ import annotations

import os
import signal
import time

import torch
from fx_common import make_op

#: The kill arrives within milliseconds; this only bounds a test that forgot to send it.
WAIT_S = 60.0


def _fault(x: torch.Tensor) -> None:
    marker = os.environ.get("OPGATE_FX_KILL_MARKER")
    if not marker:
        return
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        return  # a later process: correct
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    if os.environ.get("OPGATE_FX_KILL") == "forkserver":
        os.kill(os.getppid(), signal.SIGKILL)
    time.sleep(WAIT_S)


scale = make_op("opgate_fx::killed_scale", _fault)
