"""Idempotent alerts: a JSON state file of what each platform already received.

Key: platform + run id + cell (with device, and shape for perf) + kind of
regression.  Re-running the alert step of the same workflow run (a re-run of
a failed job, a retried step) posts nothing new; a later run with the same
regression posts again, because its run id differs.  Keys hold no secrets,
only ids, so the state file can be an uploaded artifact or a cache entry.

Without ``--state`` the state lives in the user's state folder
(``$XDG_STATE_HOME/opgate/alerts-sent.json``, i.e. ``~/.local/state/...``), so
two runs on one machine do not post twice either; entries older than
:data:`KEEP_DAYS` are dropped.  The state is held under an exclusive lock from
reading it to saving it, so two ``opgate alert`` processes sharing it cannot
both post the same regression, and the file it is saved through is opened
*before* anything is posted: a state that cannot be written refuses the
alert up front instead of posting and then crashing (which would post it
again on the re-run).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from opgate.matrix.errors import AlertDeliveryFailed, ResultsFormatError
from opgate.matrix.files import read_json
from opgate.reports.alerts.message import AlertItem

STATE_VERSION = 1
KEEP_DAYS = 180
STATE_NAME = "alerts-sent.json"


def default_path(env: Mapping[str, str] | None = None) -> Path:
    """``$XDG_STATE_HOME/opgate/alerts-sent.json`` (default ``~/.local/state``)."""
    env = os.environ if env is None else env
    base = env.get("XDG_STATE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".local" / "state")
    return Path(base) / "opgate" / STATE_NAME


STATE_PROBLEM = "cannot write the alert state"


def _unwritable(path: Path, exc: OSError) -> AlertDeliveryFailed:
    why = exc.strerror or str(exc)
    return AlertDeliveryFailed(f"{STATE_PROBLEM} {path}: {why}; nothing was sent")


@dataclass
class DedupState:
    path: Path | None
    sent: dict[str, dict[str, Any]] = field(default_factory=dict)
    _out: IO[str] | None = None

    @classmethod
    def load(cls, path: Path | None) -> DedupState:
        """Read ``path`` (no file yet: empty).  Use :meth:`locked` to read, send and save."""
        state = cls(path)
        if path is None or not (path.exists() or path.is_symlink()):  # a broken link is no "first run"
            return state
        data = read_json(path, what="alert state", expect=dict)
        if data.get("version") != STATE_VERSION:
            raise ResultsFormatError(f"{path}: alert state version {data!r:.40} is not {STATE_VERSION}")
        sent = data.get("sent", {})
        if not isinstance(sent, dict):
            raise ResultsFormatError(f"{path}: alert state 'sent' must be an object")
        state.sent = {str(k): v for k, v in sent.items() if isinstance(v, dict)}
        return state

    @classmethod
    @contextlib.contextmanager
    def locked(cls, path: Path | None) -> Iterator[DedupState]:
        """The state, read under its exclusive lock, held until the block ends (then released)."""
        lock = _take_lock(path) if path is not None else None
        state: DedupState | None = None
        try:
            state = cls.load(path)
            yield state
        finally:
            if state is not None:
                state.discard()
            if lock is not None:
                os.close(lock)

    @staticmethod
    def key(platform: str, item: AlertItem) -> str:
        return f"{platform}|{item.dedup_key}"

    def pending(self, platform: str, items: Iterable[AlertItem]) -> list[AlertItem]:
        return [i for i in items if self.key(platform, i) not in self.sent]

    def mark(self, platform: str, items: Iterable[AlertItem], when: str) -> None:
        for item in items:
            self.sent[self.key(platform, item)] = {"at": when, "kind": item.kind, "cell": item.cell}

    def prepare(self) -> None:
        """Open the file the state will be saved through, before anything is sent."""
        if self.path is None or self._out is not None:
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            self._out = tmp.open("w", encoding="utf-8")
        except OSError as exc:
            raise _unwritable(self.path, exc) from None

    def save(self, now: dt.datetime | None = None) -> None:
        """Write the state (entries older than :data:`KEEP_DAYS` dropped) and swap it in."""
        if self.path is None:
            return
        self.prepare()
        assert self._out is not None
        cutoff = (now or dt.datetime.now(dt.timezone.utc)) - dt.timedelta(days=KEEP_DAYS)
        kept = {k: v for k, v in self.sent.items() if not _older(v.get("at"), cutoff)}
        out, self._out = self._out, None
        with out:
            out.write(json.dumps({"version": STATE_VERSION, "sent": kept}, indent=1) + "\n")
        Path(out.name).replace(self.path)

    def discard(self) -> None:
        """Drop a save file opened by :meth:`prepare` and never used."""
        if self._out is not None:
            out, self._out = self._out, None
            out.close()
            with contextlib.suppress(OSError):
                Path(out.name).unlink()


def _take_lock(path: Path) -> int:
    """An exclusive lock beside ``path``: another alert on the same state finishes first."""
    lock = path.with_name(path.name + ".lock")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise _unwritable(path, exc) from None
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def _older(stamp: Any, cutoff: dt.datetime) -> bool:
    try:
        when = dt.datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
    except ValueError:
        return False
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return when < cutoff
