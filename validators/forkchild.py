"""Run one function in a forked child of a preloaded worker: a fresh process, without a fresh import.

A build cell cross-compiles an op's Triton kernels in a child process, never
in the worker itself: the child must see its own ``TRITON_PTXAS_PATH`` (Triton
caches the ptxas version per process) and no ``TRITON_INTERPRET``, and an op
module imported for one build must not linger for the next.  A fresh
interpreter gives all of that at the price of importing torch and Triton
again, which is most of a build cell's time (1.5 s of 1.6 s on a 2-core CPU
machine).  A fork of the build worker, which imported both before it ran any
kernel, gives the same isolation for the price of a fork: the child gets its
own environment, session and stderr, runs the function, sends back its JSON
result and exits without tearing the interpreter down.

Used only when forking is safe: one Python thread, and the modules the child
needs already imported (else there is nothing to gain); otherwise, and on any
failure to fork, the caller's fresh interpreter is used.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import select
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

MAX_TAIL_LINES = 15
#: Variables that shape a module at import: Triton decorates its own library (``tl.cdiv``) for
#: the interpreter when imported under ``TRITON_INTERPRET=1``, and no later change undoes it.
IMPORT_SENSITIVE = ("TRITON_INTERPRET",)
#: Their values when this process imported its preload (None: not recorded, never fork).
_imported_under: dict[str, str | None] | None = None


def record_import_env() -> None:
    """Called before the preload imports: what the imported modules were shaped by."""
    global _imported_under
    _imported_under = {k: os.environ.get(k) or None for k in IMPORT_SENSITIVE}


def can_fork(needs: Sequence[str], env: Mapping[str, str]) -> bool:
    """Whether a fork can stand in for a fresh interpreter with ``env``.

    Safe: one thread, and the modules were imported under the same
    import-sensitive variables as ``env`` asks for.  Worth it: ``needs`` are
    already imported.
    """
    return (
        hasattr(os, "fork")
        and threading.active_count() == 1
        and _imported_under is not None
        and all(_imported_under[k] == (env.get(k) or None) for k in IMPORT_SENSITIVE)
        and all(m in sys.modules for m in needs)
    )


def call_forked(
    target: str, arg: str, env: Mapping[str, str], timeout_s: float
) -> tuple[dict[str, Any] | None, str]:
    """``module:function(arg)`` in a forked child with ``env``: (its JSON result or None, stderr tail).

    None comes with the reason in the tail: the child crashed (its signal),
    timed out (its process group is killed) or returned nothing.
    """
    module, _, func = target.partition(":")
    out_r, out_w = os.pipe()
    with tempfile.TemporaryFile() as err:
        pid = os.fork()
        if pid == 0:  # the child: never returns
            os.close(out_r)
            _child(f"{module}:{func}", arg, env, (out_w, err.fileno()))
        os.close(out_w)
        try:
            data, status = _collect(pid, out_r, timeout_s)
        finally:
            os.close(out_r)
        err.seek(0)
        tail = "\n".join(err.read().decode(errors="replace").strip().splitlines()[-MAX_TAIL_LINES:])
    if status == "timeout":
        return None, f"{tail}\nforked child timed out after {timeout_s:g} s (killed)".strip()
    try:
        result = json.loads(data) if data else None
    except ValueError:
        result = None
    if not isinstance(result, dict):
        return None, f"{tail}\nforked child {status}".strip()
    return result, tail


def _collect(pid: int, fd: int, timeout_s: float) -> tuple[bytes, str]:
    """Read the child's result until EOF (or the deadline), then reap it: (bytes, how it ended)."""
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return b"", "timeout"
        ready, _, _ = select.select([fd], [], [], min(left, 1.0))
        if not ready:
            continue
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)  # whatever it left running (a compiler it started)
    how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
    return b"".join(chunks), how


def _child(target: str, arg: str, env: Mapping[str, str], fds: tuple[int, int]) -> None:
    """In the child: own session, stderr to the parent's file, the function's JSON on ``fds[0]``."""
    code = 70
    out, err = fds
    module, _, func = target.partition(":")
    try:
        os.setsid()  # its own group: a timeout kill takes the compilers it started
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        os.dup2(err, 1)
        os.dup2(err, 2)
        os.environ.clear()
        os.environ.update(env)
        from opgate.validators.worker import arm

        arm()  # dies with the worker
        result = getattr(importlib.import_module(module), func)(arg)
        data = json.dumps(result).encode()
        view = memoryview(data)
        while view:
            view = view[os.write(out, view) :]
        code = 0
    except BaseException:  # noqa: BLE001 - the child must never return into the worker's code
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)
