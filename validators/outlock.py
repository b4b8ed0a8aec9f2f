"""One writer per output folder: a second ``opgate run`` (or ``collect``) on a busy ``--out`` is refused.

Two runs writing the same folder lose verdicts silently: each clears the
other's ``cells/`` at start and each writes a ``results.json`` of its own
cells only, the last one winning.  So a run holds an exclusive ``flock`` on
``OUT/.opgate.lock`` from before it touches anything in OUT until its last
file is written, and a second run is refused at once, naming the holder.

``flock`` belongs to the open file, not to a pid written in it: a run killed
with SIGKILL releases it with its last file descriptor, so there is never a
stale lock to delete by hand.  Workers never inherit it (Python opens files
non-inheritable, and workers are started with ``close_fds``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from pathlib import Path
from types import TracebackType

from opgate.matrix.errors import BusyOutput, OutputError

LOCK_NAME = ".opgate.lock"


def _holder(path: Path) -> str:
    """Who holds the lock, from what it wrote (best effort: the lock itself is the truth)."""
    try:
        info = json.loads(path.read_text())
        return f"pid {int(info['pid'])}, {info['command']}, since {info['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


class OutputLock:
    """Exclusive hold on an output folder (created if missing) for one command."""

    def __init__(self, out: Path, command: str) -> None:
        self.out = Path(out)
        self.command = command
        self.path = self.out / LOCK_NAME
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> OutputLock:
        if self.out.exists() and not self.out.is_dir():
            raise OutputError(f"--out {self.out}: is a file, not a folder")
        try:
            self.out.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise OutputError(f"--out {self.out}: cannot write there: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise BusyOutput(
                f"--out {self.out}: another opgate run is writing there ({_holder(self.path)}); "
                "running both would lose verdicts: wait for it, or choose another --out"
            ) from None
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        record = json.dumps({"pid": os.getpid(), "command": self.command, "since": stamp}) + "\n"
        with contextlib.suppress(OSError):  # only informs the message above
            os.ftruncate(fd, 0)
            os.pwrite(fd, record.encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        os.close(fd)  # closing the last descriptor drops the flock

    def __enter__(self) -> OutputLock:
        return self.acquire()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()
