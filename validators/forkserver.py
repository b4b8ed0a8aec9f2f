"""Fork server: one process imports torch once, every worker of its kind is forked from it.

Why: a worker's start-up is almost all imports (torch, Triton, Dynamo: 3-4 s
on the H200 host with bytecode cached, 11-17 s without, more when several start
at once), and the pool starts a worker per
lane, per isolated cell and per re-run.  Forking a process that has imported
everything but has not touched the GPU gives a worker in well under a second;
CUDA is initialised in the child, after the fork, as it must be.

The isolation guarantees are those of a spawned worker: each child calls
``setsid`` (own process group, killed as a group), gets its own stdin,
stdout channel and log on fds 0-2, and dies with its parent.  The server
reaps its children and reports each exit status, so the pool still tells a
SIGSEGV from a clean exit.

A warm server (:mod:`validators.warmserver`) outlives the run that started
it and serves later runs with the same environment key; a worker of a run
that goes away is killed by the server then, so it still dies with its run.

Protocol on a ``SOCK_SEQPACKET`` socket pair, or a connection to a warm
server's path (one message per packet)::

    server -> {"ready": true, "preload_s": s, "reused": b}   once, after the imports
    parent -> {"env": {...}, "kind": k, "standby": b} + fds [stdin, stdout, log]  one per worker
              (to a warm server also "ops_paths" and "cwd": the run's own specs and folder;
              "standby": a standby worker may serve it, see ``forkloop``)
    server -> {"pid": n, "standby": b}                    the forked (or standby) worker
    server -> {"exit": n, "status": rc}                   whenever a worker ends (rc < 0: signal)
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

MAX_MSG = 1 << 20
READY_TIMEOUT_S = 180.0


# -- parent side ----------------------------------------------------------------------------------
class ForkServer:
    """The pool's handle on one fork server (one per worker kind).

    Either the run's own (spawned here, ended by :meth:`stop`) or, given a
    ``connection``, a warm server's (:mod:`validators.warmserver`): ``proc``
    is then the server if this run started it, else None, and :meth:`stop`
    only hangs up (the server stays warm for the next run).
    """

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        log: Path,
        *,
        connection: socket.socket | None = None,
        proc: subprocess.Popen[bytes] | None = None,
        request: Mapping[str, Any] | None = None,
    ) -> None:
        self.warm = connection is not None
        self.proc: subprocess.Popen[bytes] | None = proc
        if connection is not None:
            self.sock = connection
        else:
            self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            log.parent.mkdir(parents=True, exist_ok=True)
            with log.open("ab") as err:
                self.proc = subprocess.Popen(
                    [*argv, "--fork-server", str(theirs.fileno())],
                    pass_fds=(theirs.fileno(),),
                    stdin=subprocess.DEVNULL,
                    stdout=err,
                    stderr=err,
                    env=dict(env),
                    start_new_session=True,
                )
            theirs.close()
        self.request = dict(request or {})  # what every fork request also carries (a warm server's)
        self.log = log
        self.ready = False
        self.reused = False  # a warm server that an earlier run started: no import paid here
        self.stale = ""  # why a warm server declined this run (it imported files changed since)
        self.failed = ""
        self.preload_s = 0.0
        self.closed = False  # the server hung up (or died): no fork, no exit report will come
        self.statuses: dict[int, int] = {}
        self.started = time.monotonic()

    @property
    def gone(self) -> bool:
        """The server can no longer fork nor report (its process ended or its socket closed)."""
        if self.closed:
            return True
        if not self.warm and self.proc is not None:
            return self.proc.poll() is not None
        self.poll_exits()  # a warm server's end shows as the socket closing
        return self.closed

    def _hello(self, msg: Mapping[str, Any]) -> bool:
        self.ready = bool(msg.get("ready"))
        self.preload_s = float(msg.get("preload_s") or 0.0)
        self.reused = bool(msg.get("reused"))
        self.stale = str(msg.get("stale") or "")
        return self.ready

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> bool:
        """Block until the imports are done; False (and ``failed`` says why) if they never finish."""
        if self.ready or self.failed:
            return self.ready
        deadline = time.monotonic() + timeout_s
        while not self.ready:
            msg = self._recv(deadline - time.monotonic())
            if msg is None:
                rc = self.proc.poll() if self.proc is not None else None
                why = f"exited {rc}" if rc is not None else "hung up" if self.closed else "timed out"
                self.failed = f"fork server {why}"
                self.stop()
                return False
            self._hello(msg)
        return True

    def poll_ready(self) -> bool:
        """Whether a fork would start now, without waiting: imports done, or the server failed.

        A failed server is "ready" too: its workers start at once, as fresh
        interpreters.  The pool asks this before it starts a worker, so lanes
        take cells whose server is ready instead of blocking on one that imports.
        """
        if self.ready or self.failed:
            return True
        msg = self._recv(0.0)
        if msg is not None:
            return self._hello(msg)
        if self.gone or time.monotonic() - self.started > READY_TIMEOUT_S:
            self.wait_ready(0.0)  # a last message, or why it failed (forks then fall back)
            return True
        return False

    def fork(
        self, env: Mapping[str, str], log: Path, kind: str = "", *, standby: bool = False
    ) -> ForkedProcess:
        """A worker of ``kind`` (default: the server's) in ``serve_loop``; OSError if the server is gone.

        ``standby``: a warm server may answer with a worker it started before
        the run (``forkloop``), warmed up; never for a cell that needs a fresh process.
        """
        if not self.wait_ready():
            raise OSError(self.failed)
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        log.parent.mkdir(parents=True, exist_ok=True)
        err = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            request = {**self.request, "env": dict(env), "kind": kind, "standby": standby}
            socket.send_fds(self.sock, [json.dumps(request).encode()], [in_r, out_w, err])
        except OSError as exc:
            for fd in (in_w, out_r):
                os.close(fd)
            self._give_up(f"fork server gone ({exc.strerror or exc})")
            raise
        finally:
            for fd in (in_r, out_w, err):
                os.close(fd)
        deadline = time.monotonic() + 30.0
        while True:
            msg = self._recv(deadline - time.monotonic())
            if msg is None:
                for fd in (in_w, out_r):
                    os.close(fd)
                self._give_up("fork server did not answer a fork request")
                raise OSError(self.failed)
            if "pid" in msg:
                return ForkedProcess(int(msg["pid"]), in_w, out_r, self)

    def _give_up(self, why: str) -> None:
        """No more forks from this server: later workers start as fresh interpreters.

        A server that lost its socket would fail every fork the same way, and
        one that did not answer may still answer late, to the next request
        (whose worker would then be the wrong process).  Its socket stays open:
        the workers it forked before run on and their exits are still reported
        (a late answer among those reports is read and ignored).
        """
        self.failed = self.failed or why
        self.ready = False

    def hear(self, timeout_s: float) -> None:
        """Take the server's answer if it comes within ``timeout_s`` (one still importing sends none yet)."""
        self._recv(timeout_s)

    def poll_exits(self) -> None:
        """Collect exit reports that arrived (non-blocking)."""
        while self._recv(0.0) is not None:
            pass

    def _recv(self, timeout_s: float) -> dict[str, Any] | None:
        """The next message, or None: none in ``timeout_s``, or the socket is closed (``closed``).

        A stopped server's socket is closed here: asking it again reports nothing more
        (a fork it left then counts as orphaned), never raises.
        """
        if self.closed:
            return None
        try:
            if timeout_s > 0:
                self.sock.settimeout(timeout_s)
            else:
                self.sock.setblocking(False)
            data = self.sock.recv(MAX_MSG)
        except (BlockingIOError, TimeoutError):
            return None
        except OSError:  # reset, or closed here
            data = b""
        if not data:
            self.closed = True
            return None
        msg: dict[str, Any] = json.loads(data)
        if "ready" in msg:  # kept whoever reads it (a poll for exits may come first)
            self._hello(msg)
        if "exit" in msg:
            self.statuses[int(msg["exit"])] = int(msg["status"])
        return msg

    def stop(self) -> None:
        """Close the socket: the run's own server exits, a warm one stays (and kills what is left)."""
        with contextlib.suppress(OSError):
            self.sock.close()
        self.closed = True
        if self.warm or self.proc is None:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


class ForkedProcess:
    """The ``subprocess.Popen`` subset the pool uses, for a worker forked by a :class:`ForkServer`."""

    def __init__(self, pid: int, stdin_fd: int, stdout_fd: int, server: ForkServer) -> None:
        self.pid = pid
        self.stdin: IO[bytes] | None = os.fdopen(stdin_fd, "wb")
        self.stdout: IO[bytes] | None = os.fdopen(stdout_fd, "rb")
        self.returncode: int | None = None
        self._server = server

    @property
    def orphaned(self) -> bool:
        """The fork server is gone: no exit status will come, and the worker died with it (PDEATHSIG)."""
        return self.poll() is None and self._server.gone

    @property
    def left_to_server(self) -> bool:
        """A warm server's fork: when the run lets go of the server, the server kills and reaps it."""
        return self._server.warm and not self._server.gone

    def poll(self) -> int | None:
        if self.returncode is None:
            self._server.poll_exits()
            self.returncode = self._server.statuses.get(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """The exit status the fork server reported (TimeoutExpired, like Popen, if none came)."""
        deadline = time.monotonic() + (timeout if timeout is not None else 1e9)
        while self.poll() is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
            if self._server.gone:  # reports already in were drained by poll()
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)  # no one left to report
            self._server._recv(min(left, 0.5))
        assert self.returncode is not None
        return self.returncode
