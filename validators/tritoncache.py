"""Workers that need the same Triton kernel compile it once: a per-kernel lock in Triton's cache.

Why: a run's lanes start the cells of one op side by side, and the cells of
one dtype and layout (eager, compile, CUDA graphs, export) launch the same
kernel variants.  Triton's cache is shared on disk, but a miss is a miss in
every worker that looks before the first one has written: each compiles the
kernel, and after a change to one op's kernel every one of its variants is a
miss at the same moment in every lane.

How: :class:`SingleFlightCacheManager` is Triton's own ``FileCacheManager``
(the files and their layout are unchanged) with one difference.  When a
kernel's group file is missing, it takes an exclusive ``flock`` on a lock
file in that kernel's cache folder before answering.  The first worker gets
the lock, finds the file still missing and compiles; ``put_group``, Triton's
last write of a compile, releases it.  A worker that had to wait looks again
once it has the lock and finds the kernel there: a hit, at the price of the
wait.  Workers run it because the worker environment names it in
``TRITON_CACHE_MANAGER`` (:func:`worker_env`), which Triton reads at each
compile.

Nothing can hang on it: a wait is bounded (:data:`WAIT_S`; after it the
waiter compiles as Triton always did), a compile that raises drops its
manager and with it the lock (:meth:`SingleFlightCacheManager.__del__`), and
a process that dies releases its ``flock`` with it.  Triton's override and
dump managers (``TRITON_KERNEL_OVERRIDE``, ``TRITON_KERNEL_DUMP``) are left as
Triton has them.  ``OPGATE_TRITON_SINGLE_FLIGHT=0``, or a
``TRITON_CACHE_MANAGER`` of the user's own, leaves Triton's default.

The class subclasses Triton's manager, so it is made on first use, when Triton
looks it up in a worker (the module's ``__getattr__``): the runner imports this
module for :func:`worker_env` without importing Triton.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from opgate.validators.options import switched_off

#: The variable Triton reads the cache manager class from, and this class's address.
VARIABLE = "TRITON_CACHE_MANAGER"
MANAGER = "opgate.validators.tritoncache:SingleFlightCacheManager"
#: The lock's name in a kernel's cache folder (beside Triton's own files).
LOCK_NAME = "opgate-compile.lock"
#: The longest a worker waits for another's compile of the same kernel before compiling it
#: itself.  A Triton compile takes well under a second to tens of seconds.
WAIT_S = 180.0
#: Seconds this process has spent blocked on another worker's compile of a kernel it needed:
#: each check reads the difference (:func:`opgate.validators.checks.base.run_check`), and the
#: run breakdown counts it as the harness's wait, not as compile or kernel work.
WAIT_SECONDS = [0.0]


def worker_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables that give a worker started with ``env`` the single-flight manager ({} to leave it)."""
    if switched_off(env, "OPGATE_TRITON_SINGLE_FLIGHT"):
        return {}
    if env.get(VARIABLE, MANAGER) != MANAGER:  # the user's own manager stays
        return {}
    return {VARIABLE: MANAGER}


def _acquire(path: str, wait_s: float) -> int | None:
    """An exclusive ``flock`` on ``path`` (its descriptor), or None after ``wait_s`` without it."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return None  # an unwritable cache: Triton's own behaviour
    start = time.monotonic()
    deadline = start + wait_s
    pause = 0.005
    try:
        while not _try_lock(fd):
            if time.monotonic() >= deadline:
                os.close(fd)
                return None
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
    finally:
        WAIT_SECONDS[0] += time.monotonic() - start
    return fd


def _try_lock(fd: int) -> bool:
    """Whether the exclusive lock was taken now (an unlockable file counts as taken: no waiting)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:
        return True
    return True


def _release(fd: int) -> None:
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_UN)
    with contextlib.suppress(OSError):
        os.close(fd)


def _manager_class() -> type:
    """Triton's ``FileCacheManager`` with the single-flight miss (built on first use, in a worker)."""
    from triton.runtime.cache import FileCacheManager  # here: the parent never imports Triton

    class SingleFlightCacheManager(FileCacheManager):  # type: ignore[misc]
        """Triton's file cache; a miss waits for a compile of the same kernel in progress elsewhere."""

        def __init__(self, key: str, override: bool = False, dump: bool = False) -> None:
            super().__init__(key, override=override, dump=dump)
            self._single = not (override or dump)
            self._held: int | None = None

        def get_group(self, filename: str) -> dict[str, str] | None:
            group: dict[str, str] | None = super().get_group(filename)
            if group is not None or not self._single or self._held is not None:
                return group
            fd = _acquire(str(Path(self.cache_dir) / LOCK_NAME), WAIT_S)
            if fd is None:
                return None  # waited long enough (or no lock to be had): compile here too
            group = super().get_group(filename)
            if group is not None:  # another worker compiled it while this one waited
                _release(fd)
                return group
            self._held = fd  # this worker compiles; put_group (or the manager's end) releases
            return None

        def put_group(self, filename: str, group: dict[str, str]) -> Any:
            try:
                return super().put_group(filename, group)
            finally:
                self.release()

        def release(self) -> None:
            """Let the workers waiting for this kernel look again (idempotent)."""
            fd, self._held = self._held, None
            if fd is not None:
                _release(fd)

        def __del__(self) -> None:
            # A compile that raised never reached put_group: its manager goes with its frame.
            # (At interpreter exit the module may be half torn down; the process's end frees the lock.)
            with contextlib.suppress(Exception):
                self.release()

    return SingleFlightCacheManager


def __getattr__(name: str) -> Any:
    """``SingleFlightCacheManager``, which Triton looks up by name (:data:`MANAGER`), built once."""
    if name != "SingleFlightCacheManager":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    cls = _manager_class()
    globals()[name] = cls
    return cls
