"""Fork server: one process imports torch once, every worker of its kind is forked from it.

Why: a worker's start-up is almost all imports (torch, Triton, Dynamo: 7-10 s
on a GPU host when several start at once), and the pool starts a worker per
lane, per isolated cell and per re-run.  Forking a process that has imported
everything but has not touched the GPU gives a worker in well under a second;
CUDA is initialised in the child, after the fork, as it must be.

The isolation guarantees are those of a spawned worker: each child calls
``setsid`` (own process group, killed as a group), gets its own stdin,
stdout channel and log on fds 0-2, and dies with its parent.  The server
reaps its children and reports each exit status, so the pool still tells a
SIGSEGV from a clean exit.

Protocol on a ``SOCK_SEQPACKET`` socket pair (one message per packet)::

    server -> {"ready": true, "preload_s": s}           once, after the imports
    parent -> {"env": {...}, "kind": k} + fds [stdin, stdout, log]  one per worker
    server -> {"pid": n}                                  the forked worker
    server -> {"exit": n, "status": rc}                   whenever a worker ends (rc < 0: signal)
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opgate.validators.worker import Preloaded

MAX_MSG = 1 << 20
READY_TIMEOUT_S = 180.0


# -- server side (runs in the fork-server process) ----------------------------------------------
def serve_forks(fd: int, kind: str, threads: int, ops_paths: Sequence[Path]) -> int:
    """Preload, say ready, then fork a worker per request until the parent closes the socket."""
    from opgate.validators.worker import Preloaded, preload

    t0 = time.perf_counter()
    sock = socket.socket(fileno=fd)
    # ``torch.cuda.is_available()`` asks the CUDA runtime for a device count, and
    # that alone marks every later fork "bad" (CUDA can then never start in the
    # child), though ``is_initialized()`` stays False.  Triton's driver probe and
    # library imports call it freely; through NVML the same question leaves forks
    # usable.  A documented torch switch, read on each call.
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    specs, run_cell = preload(ops_paths, kind)
    pre = Preloaded(kind, threads, specs, run_cell)
    import torch

    if torch.cuda.is_initialized():  # e.g. a sitecustomize or an op module that touched the GPU
        print("fork server: CUDA initialised while preloading; forks could not use it", file=sys.stderr)
        return 3  # never ready: the launcher starts fresh interpreters instead
    if _forks_poisoned():
        print(
            "fork server: a forked child could not start CUDA (the preload asked the CUDA runtime "
            "for devices); starting fresh interpreters instead",
            file=sys.stderr,
        )
        return 3
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the selector through the pipe
    _send(sock, {"ready": True, "preload_s": round(time.perf_counter() - t0, 3)})
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ, "parent")
    sel.register(wake_r, selectors.EVENT_READ, "child")
    while True:
        for key, _ in sel.select():
            if key.data == "child":
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 4096)
                _reap(sock)
                continue
            msg, fds, _, _ = socket.recv_fds(sock, MAX_MSG, 3)
            if not msg:
                return 0  # the parent is done
            pid = os.fork()
            if pid == 0:
                sock.close()
                os.close(wake_r)
                os.close(wake_w)
                _become_worker(json.loads(msg), fds, pre)  # never returns
            for f in fds:
                os.close(f)
            _send(sock, {"pid": pid})


def _forks_poisoned() -> bool:
    """Whether a child forked now would refuse to start CUDA (checked in a real fork).

    torch poisons forks through a ``pthread_atfork`` handler that nothing in
    the parent can read back, so the only sure answer is a child's.
    """
    import torch

    pid = os.fork()
    if pid == 0:
        os._exit(1 if torch.cuda._is_in_bad_fork() else 0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) != 0


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(sock, {"exit": pid, "status": os.waitstatus_to_exitcode(status)})


def _become_worker(req: Mapping[str, Any], fds: Sequence[int], pre: Preloaded) -> None:
    """In the forked child: own session, the parent's pipes on fds 0-2, the lane's environment."""
    from opgate.validators import worker

    t0 = time.perf_counter()
    code = 70
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        for target, fd in zip((0, 1, 2), fds, strict=True):
            os.dup2(fd, target)
        for fd in fds:
            os.close(fd)
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 - fd 0 lives as long as the process
        os.environ.clear()
        os.environ.update(req["env"])
        channel = worker._channel()
        worker.arm()
        kind = str(req.get("kind") or pre.kind)
        code = worker.serve_loop(channel, dataclasses.replace(pre, kind=kind), t0)
    except BaseException:  # noqa: BLE001 - a child must never return into the server's loop
        import traceback

        traceback.print_exc()
    finally:
        worker.exit_now(code)


def _send(sock: socket.socket, msg: Mapping[str, Any]) -> None:
    sock.send(json.dumps(msg).encode())


# -- parent side ----------------------------------------------------------------------------------
class ForkServer:
    """The pool's handle on one fork server (one per worker kind)."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], log: Path) -> None:
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
        self.log = log
        self.ready = False
        self.failed = ""
        self.preload_s = 0.0
        self.statuses: dict[int, int] = {}
        self.started = time.monotonic()

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> bool:
        """Block until the imports are done; False (and ``failed`` says why) if they never finish."""
        if self.ready or self.failed:
            return self.ready
        deadline = time.monotonic() + timeout_s
        while not self.ready:
            msg = self._recv(deadline - time.monotonic())
            if msg is None:
                rc = self.proc.poll()
                self.failed = f"fork server {'exited ' + str(rc) if rc is not None else 'timed out'}"
                self.stop()
                return False
            self.ready = bool(msg.get("ready"))
            self.preload_s = float(msg.get("preload_s") or 0.0)
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
            self.ready = bool(msg.get("ready"))
            self.preload_s = float(msg.get("preload_s") or 0.0)
            return self.ready
        gone = self.proc.poll() is not None
        if gone or time.monotonic() - self.started > READY_TIMEOUT_S:
            self.wait_ready(0.0)  # a last message, or why it failed (forks then fall back)
            return True
        return False

    def fork(self, env: Mapping[str, str], log: Path, kind: str = "") -> ForkedProcess:
        """A worker of ``kind`` (default: the server's) in ``serve_loop``; OSError if the server is gone."""
        if not self.wait_ready():
            raise OSError(self.failed)
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        log.parent.mkdir(parents=True, exist_ok=True)
        err = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            request = {"env": dict(env), "kind": kind}
            socket.send_fds(self.sock, [json.dumps(request).encode()], [in_r, out_w, err])
        finally:
            for fd in (in_r, out_w, err):
                os.close(fd)
        deadline = time.monotonic() + 30.0
        while True:
            msg = self._recv(deadline - time.monotonic())
            if msg is None:
                for fd in (in_w, out_r):
                    os.close(fd)
                raise OSError("fork server did not answer a fork request")
            if "pid" in msg:
                return ForkedProcess(int(msg["pid"]), in_w, out_r, self)

    def poll_exits(self) -> None:
        """Collect exit reports that arrived (non-blocking)."""
        while self._recv(0.0) is not None:
            pass

    def _recv(self, timeout_s: float) -> dict[str, Any] | None:
        if timeout_s > 0:
            self.sock.settimeout(timeout_s)
        else:
            self.sock.setblocking(False)
        try:
            data = self.sock.recv(MAX_MSG)
        except (BlockingIOError, TimeoutError, OSError):
            return None
        if not data:
            return None
        msg: dict[str, Any] = json.loads(data)
        if "exit" in msg:
            self.statuses[int(msg["exit"])] = int(msg["status"])
        return msg

    def stop(self) -> None:
        """Close the socket (the server exits); its workers run on until stopped themselves."""
        with contextlib.suppress(OSError):
            self.sock.close()
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
        return self.poll() is None and self._server.proc.poll() is not None

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
            if self._server.proc.poll() is not None:  # reports already in were drained by poll()
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)  # no one left to report
            self._server._recv(min(left, 0.5))
        assert self.returncode is not None
        return self.returncode
