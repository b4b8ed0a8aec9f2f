"""The one error path of every stage's command line: a line on stderr and the error's exit code.

Each stage's ``main`` runs its command through :func:`guarded`, so whatever
stops a command ends the same way, whichever stage it is in:

* an :class:`~matrix.errors.OpgateError` (bad config 3, unreadable results 7,
  ...) prints its one-line message and exits with its own code;
* an ``OSError`` that reached the top is an output the command could not
  write (``--out`` is a file, a read-only or full disk): every *input* is read
  through :mod:`matrix.files`, which already turned its problems into the
  stage's own error, so what is left is the output side (exit 2, naming the
  path);
* SIGINT, and SIGTERM (a cancelled CI job: turned into ``KeyboardInterrupt``
  so ``finally`` blocks stop workers and remove temporary folders) exit 130;
* a closed stdout (``opgate list | head``) is not an error.

Anything else is a bug in opgate and keeps its traceback.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

from opgate.matrix.errors import Interrupted, OpgateError, OutputError


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """While inside, SIGTERM unwinds like Ctrl-C (main thread only; restored on the way out)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def output_error(exc: OSError) -> OutputError:
    """An OSError as the one-line output problem it is (path and reason, no traceback)."""
    name = exc.filename if exc.filename is not None else "output"
    reason = exc.strerror or str(exc) or type(exc).__name__
    return OutputError(f"cannot write {name}: {reason}")


def _quiet_stdout() -> None:
    with contextlib.suppress(OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.stdout = Path(os.devnull).open("w")  # noqa: SIM115 - keeps interpreter exit from re-raising


def guarded(body: Callable[[], int], describe: Callable[[OpgateError], str] | None = None) -> int:
    """Run ``body`` (a command); return its exit code, or the code of whatever stopped it.

    ``describe`` formats the line printed for an error (default: its message).
    """
    fmt = describe or (lambda err: err.message())
    try:
        with sigterm_interrupts():
            return body()
    except OpgateError as err:
        failure: OpgateError = err
    except KeyboardInterrupt:
        failure = Interrupted("interrupted")
    except BrokenPipeError:
        _quiet_stdout()
        return 0
    except OSError as exc:
        failure = output_error(exc)
    with contextlib.suppress(OSError, ValueError):
        print(fmt(failure), file=sys.stderr, flush=True)
    return failure.exit_code
