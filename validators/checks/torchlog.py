"""What torch logged while a cell ran: its warnings name causes its exceptions do not.

A Triton kernel launched through ``wrap_triton`` (``torch.library.triton_op``)
is analysed by Inductor when the graph compiles.  When the analysis fails,
torch logs a warning ("Encountered an exception in identify_accessed_tensors,
assuming every input is mutated", the exception attached) and compiles on.
The error, if any, comes later and elsewhere: on torch 2.11 a kernel whose
defaulted ``tl.constexpr`` the call leaves out crashes in Inductor's launcher
with ``launcher() missing 1 required positional argument: '_grid_2'``, while
the cause ("Incorrect number of arguments passed to kernel: passed [...],
expected [...]") is only in that earlier warning
(``results/runs/h200-triton-op-repro``).

So a cell collects the warnings torch logs while its checks run
(:func:`collecting`), and a check that fails or crashes carries them
(``details["torch_logged"]``), with the fix in its summary where opgate can
name it (:data:`HINTS`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

#: The most distinct warnings a cell keeps (torch can log one per recompile).
MAX_KEPT = 8
#: The longest a kept warning line gets.
MAX_CHARS = 500
#: Causes in a torch warning -> what to do about them, in the op author's terms.
HINTS = (
    (
        "Incorrect number of arguments passed to kernel",
        (
            "torch logged while compiling: {line}. Inductor could not match the call to the Triton "
            "kernel's parameters and treats every input as mutated; pass every kernel parameter at "
            "the call, defaulted tl.constexpr ones included"
        ),
    ),
)


class _Collect(logging.Handler):
    """Distinct WARNING-and-above lines under the ``torch`` logger, each with its exception."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = (record.getMessage().strip().splitlines() or [""])[0]
            exc = record.exc_info[1] if record.exc_info else None
            if exc is not None:
                first = (str(exc).strip().splitlines() or [""])[0]
                line = f"{line} ({type(exc).__name__}: {first})"
        except Exception:  # noqa: BLE001 - a record that does not format is not worth a crash
            return
        line = line[:MAX_CHARS]
        if line and line not in self.lines and len(self.lines) < MAX_KEPT:
            self.lines.append(line)


_ACTIVE: list[_Collect] = []


def _torch_loggers() -> list[logging.Logger]:
    """``torch`` and every torch logger that does not pass its records up to it.

    torch's logging setup gives its component loggers (``torch._dynamo``,
    ``torch._inductor``, ``torch._higher_order_ops`` ...) handlers of their own
    and ``propagate = False``: a handler on ``torch`` alone never sees their
    records (Inductor's "skipping cudagraphs due to ..." among them).  A record
    stops at the first such logger on its way up, so one handler on each sees
    every record once.
    """
    loggers = [logging.getLogger("torch")]
    for name, logger in list(logging.Logger.manager.loggerDict.items()):
        if name.startswith("torch.") and isinstance(logger, logging.Logger) and not logger.propagate:
            loggers.append(logger)
    return loggers


@contextlib.contextmanager
def collecting() -> Iterator[list[str]]:
    """Collect what torch warns while the block runs (the lines, as they come)."""
    handler = _Collect()
    loggers = _torch_loggers()
    for logger in loggers:
        logger.addHandler(handler)
    _ACTIVE.append(handler)
    try:
        yield handler.lines
    finally:
        _ACTIVE.remove(handler)
        for logger in loggers:
            logger.removeHandler(handler)


def logged() -> list[str]:
    """What torch has warned so far in the innermost :func:`collecting` block ([] outside one)."""
    return list(_ACTIVE[-1].lines) if _ACTIVE else []


def hint(lines: list[str]) -> str | None:
    """The fix for the first logged cause opgate can name, else None."""
    for line in lines:
        for cause, text in HINTS:
            if cause in line:
                return text.format(line=line)
    return None
