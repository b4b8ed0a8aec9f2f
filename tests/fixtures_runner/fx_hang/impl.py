"""Planted fault: the kernel never returns on float16 inputs, deaf to SIGTERM and SIGINT."""

from __future__ import annotations

import signal
import time

import torch
from fx_common import make_op


def _fault(x: torch.Tensor) -> None:
    if x.dtype == torch.float16:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
        while True:
            time.sleep(3600)


scale = make_op("opgate_fx::hang_scale", _fault)
