"""The fork server's own side: preload once, then fork a worker per request (see ``forkserver``).

Runs in the server process, never in a run: :func:`serve_forks` imports what
every worker of its kind needs, refuses to serve if that touched CUDA, and
then loops over the runs connected to it (one for a run's own server, any
number for a warm one), forking a worker per request and reporting each
worker's exit to the run that asked for it.  The protocol and the run's side
are in :mod:`validators.forkserver`; finding and starting warm servers is
:mod:`validators.warmserver`.

Standby workers: when a run leaves a warm server, the server forks as many
workers as that run had at once, each of which makes its CUDA context while
no run waits (:func:`worker.start_standby`), then blocks on a socket of its
own.  The next run with the same environment gets one of them instead of a
fresh fork for each lane's first worker: it takes cells at once instead of
after ~0.8 s of context (a run that comes before they are ready takes them
still starting: the request waits in their socket).  A worker for an isolated cell or a re-run is
always a fresh fork.  A standby loads the op specs when a run takes it (they may have
changed since), dies with the server, and is stopped when the server goes
stale or idle.  ``OPGATE_STANDBY`` in the run's environment chooses which
kinds get them (:data:`STANDBY_KINDS`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import selectors
import signal
import socket
import stat
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from opgate.validators.forkserver import MAX_MSG
from opgate.validators.warmserver import keyed

#: ``OPGATE_STANDBY`` values -> the worker kinds a warm server keeps standby workers for.  GPU
#: workers by default: what they make before their first cell (a CUDA context) is worth
#: keeping; a CPU worker's start is a fork.
STANDBY_KINDS: Mapping[str, frozenset[str]] = {
    "": frozenset({"cuda"}),
    "gpu": frozenset({"cuda"}),
    "all": frozenset({"cuda", "cpu"}),
    "0": frozenset(),
    "off": frozenset(),
}
#: The most standby workers one warm server keeps (each GPU one holds a CUDA context).
MAX_STANDBY = 16

if TYPE_CHECKING:
    from opgate.validators.worker import Preloaded


def serve_forks(  # noqa: PLR0917 - the worker's command line, argument for argument
    fd: int | None, kind: str, threads: int, ops_paths: Sequence[Path], listen: str = "", idle_s: float = 0.0
) -> int:
    """Preload, say ready, then fork a worker per request.

    A run's own server (``fd``) serves that run and exits when it closes the
    socket.  A warm server (``listen``, :mod:`validators.warmserver`) binds the
    path before it imports, so runs that start meanwhile queue on it, serves
    every run that connects, and exits after ``idle_s`` with no run and no
    worker.  The specs a warm server's workers see are loaded per run, from
    the paths the run's requests name (a spec may change between runs; the
    imports do not).
    """
    from opgate.validators.worker import Preloaded, preload

    t0 = time.perf_counter()
    listener = _bind(listen) if listen else None
    if listen and listener is None:
        return 0  # another warm server holds the path: runs connect to it
    if listener is not None:  # what ``opgate servers`` lists, written as soon as the path is ours
        note = {"pid": os.getpid(), "kind": kind, "path": listen, "started": time.time(), "idle_s": idle_s}
        Path(listen).with_suffix(".json").write_text(json.dumps(note) + "\n")
    # ``torch.cuda.is_available()`` asks the CUDA runtime for a device count, and
    # that alone marks every later fork "bad" (CUDA can then never start in the
    # child), though ``is_initialized()`` stays False.  Triton's driver probe and
    # library imports call it freely; through NVML the same question leaves forks
    # usable.  A documented torch switch, read on each call.
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    specs, run_cell = preload(ops_paths, kind, for_forks=True)
    pre = Preloaded(kind, threads, specs, run_cell)
    import torch

    refused = ""
    if torch.cuda.is_initialized():  # e.g. a sitecustomize or an op module that touched the GPU
        refused = "fork server: CUDA initialised while preloading; forks could not use it"
    elif _forks_poisoned():
        refused = (
            "fork server: a forked child could not start CUDA (the preload asked the CUDA runtime "
            "for devices); starting fresh interpreters instead"
        )
    if refused:
        print(refused, file=sys.stderr)
        if listener is not None:
            _unbind(listener, listen)
        return 3  # never ready: the launcher starts fresh interpreters instead
    loop = _Loop(pre, round(time.perf_counter() - t0, 3), listener, listen, idle_s)
    if fd is not None:
        loop.attach(socket.socket(fileno=fd), reused=False)
    if listener is not None:
        signal.signal(signal.SIGTERM, _terminate)  # ``opgate servers --stop``: tidy up, then go
    try:
        return loop.run()
    finally:
        if loop.listener is not None:
            _unbind(loop.listener, listen)
        for pid in [*loop.owner, *loop.standby] if loop.warm else ():  # no worker outlives it
            _kill(pid)


def _kill(pid: int) -> None:
    """SIGKILL a worker of this server and its process group.

    A worker forked a moment ago may not have called ``setsid`` yet: it has
    no group of its own then, and only the process itself can be killed.
    """
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    except PermissionError:
        pass


def _terminate(*_: object) -> None:
    raise SystemExit(0)


def import_snapshot() -> dict[str, tuple[int, int]]:
    """(mtime, size) of every imported module's file and every ``sys.path`` folder but the first."""
    seen: dict[str, tuple[int, int]] = {}
    files = [getattr(m, "__file__", None) for m in list(sys.modules.values())]
    for path in [f for f in files if isinstance(f, str)] + [d for d in sys.path[1:] if d]:
        with contextlib.suppress(OSError):
            st = Path(path).stat()
            seen[path] = (st.st_mtime_ns, 0 if stat.S_ISDIR(st.st_mode) else st.st_size)
    return seen


def changed_since(snapshot: Mapping[str, tuple[int, int]]) -> str:
    """The first file of ``snapshot`` that changed or went away; "" when none did."""
    for path, (mtime, size) in snapshot.items():
        try:
            st = os.stat(path)  # noqa: PTH116 - thousands of modules per connection: no Path objects
        except OSError:
            return f"{path} is gone"
        if st.st_mtime_ns != mtime or (size and st.st_size != size):
            return f"{path} changed"
    return ""


def _bind(path: str) -> socket.socket | None:
    """A listening socket at ``path``; None when a live server already listens there."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.bind(path)
    except OSError as exc:
        sock.close()
        print(f"fork server: {path} is taken ({exc}); leaving it to the server there", file=sys.stderr)
        return None
    sock.listen(64)
    return sock


def _unbind(sock: socket.socket, path: str) -> None:
    """Stop listening and remove the path and its note, unless another server has bound it since."""
    note = Path(path).with_suffix(".json")
    with contextlib.suppress(OSError, ValueError):
        if json.loads(note.read_text()).get("pid") == os.getpid():  # else a newer server's by now
            Path(path).unlink()
            note.unlink()
    sock.close()


class _Loop:
    """The server's event loop: runs connect, ask for forks, hear of their workers' exits."""

    def __init__(
        self, pre: Preloaded, preload_s: float, listener: socket.socket | None, path: str, idle_s: float
    ) -> None:
        self.pre, self.preload_s, self.listener, self.idle_s = pre, preload_s, listener, idle_s
        self.ready_at = time.monotonic()
        self.sel = selectors.DefaultSelector()
        self.owner: dict[int, socket.socket] = {}  # worker pid -> the run that asked for it
        self.specs: dict[socket.socket, Preloaded] = {}  # per run of a warm server: its own specs
        self.standby: dict[int, _Standby] = {}  # forked between runs, waiting for one (module doc)
        self.keys: dict[int, str] = {}  # a lane's worker pid -> its standby key (:func:`_standby_key`)
        #: per run and standby key: a request that may take a standby, and the most such workers
        #: the run had at once (what :meth:`_refill` forks when it leaves)
        self.asked: dict[socket.socket, dict[str, tuple[dict[str, Any], int]]] = {}
        self.served = 0
        self.path = path  # a warm server's socket path
        self.warm = listener is not None
        self.snapshot = import_snapshot() if self.warm else {}
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        self.wake = (wake_r, wake_w)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the selector through the pipe
        self.sel.register(wake_r, selectors.EVENT_READ, "child")
        if listener is not None:
            self.sel.register(listener, selectors.EVENT_READ, "listen")

    def attach(self, conn: socket.socket, *, reused: bool) -> None:
        """Say ready to a run: the imports it waited for (0 when an earlier run paid for them)."""
        _send(conn, {"ready": True, "preload_s": 0.0 if reused else self.preload_s, "reused": reused})
        self.sel.register(conn, selectors.EVENT_READ, "run")
        self.served += 1

    def run(self) -> int:
        idle_since = time.monotonic()
        while True:
            busy = bool(self.owner) or self.served_now() > 0
            if self.warm and not busy and self.listener is None:
                return 0  # stale: its last run is done
            timeout = None
            if self.warm and not busy:
                timeout = max(self.idle_s - (time.monotonic() - idle_since), 0.0)
            events = self.sel.select(timeout)
            if not events and timeout is not None:
                print(f"fork server: idle for {self.idle_s:g} s, exiting", file=sys.stderr)
                return 0
            for key, _ in events:
                if key.data == "child":
                    with contextlib.suppress(BlockingIOError):
                        os.read(self.wake[0], 4096)
                    self._reap()
                elif key.data == "listen":
                    self._accept()
                elif isinstance(key.data, _Standby):
                    self._standby_says(key.data)
                elif not self._request(key.fileobj) and not self.warm:  # type: ignore[arg-type]
                    return 0  # the run that started this server is done
            if self.owner or self.served_now():
                idle_since = time.monotonic()

    def _accept(self) -> None:
        """A run connects: served if nothing it imported has changed, else told to start afresh."""
        assert self.listener is not None
        conn, _ = self.listener.accept()
        stale = changed_since(self.snapshot)
        if stale:
            print(f"fork server: stale ({stale}); no new runs, exiting once mine are done", file=sys.stderr)
            self.sel.unregister(self.listener)
            _unbind(self.listener, self.path)  # the path is free for a fresh server now
            self.listener = None
            for standby in list(self.standby.values()):  # forked from the same stale imports
                self._drop(standby)
            with contextlib.suppress(OSError):
                _send(conn, {"ready": False, "stale": stale})
            conn.close()
            return
        # a run that queued while the imports ran waited for them; a later one did not
        self.attach(conn, reused=self.served > 0 or time.monotonic() - self.ready_at > 1.0)

    def served_now(self) -> int:
        return sum(1 for key in self.sel.get_map().values() if key.data == "run")

    def _request(self, conn: socket.socket) -> bool:
        """Serve one message of a run; False when the run has gone (its socket closed)."""
        try:
            msg, fds, _, _ = socket.recv_fds(conn, MAX_MSG, 3)
        except OSError:
            msg, fds = b"", []
        if not msg:
            self._detach(conn)
            return False
        req = json.loads(msg)
        key = _standby_key(req, self.pre.kind)
        standby = self._take_standby(key, msg, fds) if req.get("standby") else None
        if standby is not None:
            pid = standby.pid
        else:
            pre = self._preloaded(conn, req)
            pid = os.fork()
            if pid == 0:
                self._close_in_child()
                _become_worker(req, fds, pre)  # never returns
        for f in fds:
            os.close(f)
        self.owner[pid] = conn
        if req.get("standby"):  # a lane's worker (never an isolated cell's): counted for the refill
            self.keys[pid] = key
            asked = self.asked.setdefault(conn, {})
            now = sum(1 for p, c in self.owner.items() if c is conn and self.keys.get(p) == key)
            asked[key] = (req, max(now, asked.get(key, (req, 0))[1]))
        _send(conn, {"pid": pid, "standby": standby is not None})
        return True

    def _close_in_child(self) -> None:
        """In a fork: close the server's sockets and wake pipe (the runs', the standbys', the listener)."""
        socks = [key.fileobj for key in self.sel.get_map().values() if isinstance(key.fileobj, socket.socket)]
        self.sel.close()
        for sock in socks:
            sock.close()
        if self.listener is not None:
            self.listener.close()
        os.close(self.wake[0])
        os.close(self.wake[1])

    def _take_standby(self, key: str, msg: bytes, fds: Sequence[int]) -> _Standby | None:
        """Hand the request to a standby with the same ``key``; None when there is none.

        A ready one first; else one still making its CUDA context: it finished
        part of that already, where a fresh fork starts from nothing, and a
        fresh fork beside it makes two contexts at once (a run that starts
        right after another found every standby starting and forked one
        worker per lane beside them on the H200).  The request waits in the
        standby's socket until it has started up (:func:`_become_standby`).
        """
        mine = [standby for standby in self.standby.values() if standby.key == key]
        for standby in sorted(mine, key=lambda standby: not standby.ready):
            del self.standby[standby.pid]
            self.sel.unregister(standby.sock)
            try:
                socket.send_fds(standby.sock, [msg], list(fds))
            except OSError:  # it died just now: its exit is reaped as a stranger's
                standby.sock.close()
                continue
            standby.sock.close()
            return standby
        return None

    def _standby_says(self, standby: _Standby) -> None:
        """A standby is ready (its context made), or it ended before any run took it."""
        try:
            data = standby.sock.recv(MAX_MSG)
        except OSError:
            data = b""
        if data:
            standby.ready = bool(json.loads(data).get("ready"))
            return
        self.sel.unregister(standby.sock)
        standby.sock.close()
        self.standby.pop(standby.pid, None)

    def _refill(self, asked: Mapping[str, tuple[dict[str, Any], int]]) -> None:
        """Fork standbys for a run that just left: per environment, as many as it had at once.

        Standbys of an environment that run did not ask for are stopped (the
        next run is most likely its like); none are forked when its
        ``OPGATE_STANDBY`` leaves the kind out, or when the server is stale.
        """
        for standby in list(self.standby.values()):
            if standby.key not in asked:
                self._drop(standby)
        if not self.warm or self.listener is None:
            return
        for key, (req, peak) in asked.items():
            kinds = STANDBY_KINDS.get(str(req.get("env", {}).get("OPGATE_STANDBY", "")).strip().lower())
            if kinds is None or str(req.get("kind") or self.pre.kind) not in kinds:
                continue
            have = sum(1 for standby in self.standby.values() if standby.key == key)
            for _ in range(min(peak - have, MAX_STANDBY - len(self.standby))):
                self._fork_standby(req, key)

    def _fork_standby(self, req: Mapping[str, Any], key: str) -> None:
        """A standby for ``req``'s environment (:func:`_become_standby`), registered to say ready."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:
            ours.close()
            self._close_in_child()
            _become_standby(req, theirs, self.pre)  # never returns
        theirs.close()
        self.standby[pid] = standby = _Standby(pid, ours, key)
        self.sel.register(ours, selectors.EVENT_READ, standby)

    def _drop(self, standby: _Standby, *, reaped: bool = False) -> None:
        """Stop a standby nobody will take (its exit is reaped like any child's).

        ``reaped``: it died and was reaped already, so its pid (and the group
        named after it) may belong to another process by now: nothing is killed.
        A standby starts nothing of its own before a run takes it.
        """
        self.standby.pop(standby.pid, None)
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(standby.sock)
        standby.sock.close()
        if not reaped:
            _kill(standby.pid)

    def _preloaded(self, conn: socket.socket, req: Mapping[str, Any]) -> Preloaded:
        """A warm server's run gets the specs its own files say (loaded once per run)."""
        if "ops_paths" not in req:
            return self.pre
        if conn not in self.specs:
            from opgate.matrix.spec import load_specs

            try:  # the run sends its paths resolved: nothing here depends on the server's folder
                specs = load_specs([Path(p) for p in req["ops_paths"]])
            except Exception as exc:  # noqa: BLE001 - a bad spec is the run's error, never the server's
                print(f"fork server: specs did not load ({exc}); the worker loads them", file=sys.stderr)
                specs = None
            self.specs[conn] = dataclasses.replace(self.pre, specs=specs)  # type: ignore[arg-type]
        return self.specs[conn]

    def _detach(self, conn: socket.socket) -> None:
        """A run went away: a warm server kills what that run left running (its workers die with it)."""
        self.sel.unregister(conn)
        self.specs.pop(conn, None)
        for pid, owner in list(self.owner.items()):
            if owner is conn and self.warm:
                _kill(pid)
        conn.close()
        asked = self.asked.pop(conn, None)
        if asked:  # its lanes' workers: ready for the next run
            self._refill(asked)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            standby = self.standby.get(pid)
            if standby is not None:  # died before a run took it
                self._drop(standby, reaped=True)
            conn = self.owner.pop(pid, None)
            self.keys.pop(pid, None)
            if conn is not None and conn.fileno() >= 0:
                with contextlib.suppress(OSError):
                    _send(conn, {"exit": pid, "status": os.waitstatus_to_exitcode(status)})


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


@dataclasses.dataclass
class _Standby:
    """A worker forked between runs (module doc): its pid, the server's end of its socket, its key."""

    pid: int
    sock: socket.socket
    key: str
    ready: bool = False  # its CUDA context is made


def _standby_key(req: Mapping[str, Any], default_kind: str) -> str:
    """What a standby must share with a request: the worker's kind and every variable that can
    shape its CUDA context or imports (the warm server's own key's, e.g. the GPU in
    ``CUDA_VISIBLE_DEVICES``).  The rest of the request's environment is applied when it is taken.
    """
    env = req.get("env", {})
    return json.dumps([req.get("kind") or default_kind, keyed(env)])


def _leave_server() -> None:
    """In a fork of the server: its own signal handling and session (killed as a group)."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.setsid()


def _take_pipes(req: Mapping[str, Any], fds: Sequence[int]) -> IO[str]:
    """The run's pipes on fds 0-2, its environment and folder; the protocol channel."""
    from opgate.validators import worker

    for target, fd in zip((0, 1, 2), fds, strict=True):
        os.dup2(fd, target)
    for fd in fds:
        os.close(fd)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - fd 0 lives as long as the process
    os.environ.clear()
    os.environ.update(req["env"])
    if req.get("cwd"):
        os.chdir(str(req["cwd"]))  # a warm server's run may start anywhere
    return worker._channel()


def _for_request(pre: Preloaded, req: Mapping[str, Any]) -> Preloaded:
    """The preload with the request's kind, and its specs when the server had none to give."""
    if pre.specs is None:  # the warm server could not load them, or a standby: load them here
        from opgate.matrix.spec import load_specs

        pre = dataclasses.replace(pre, specs=load_specs([Path(p) for p in req["ops_paths"]]))
    return dataclasses.replace(pre, kind=str(req.get("kind") or pre.kind))


def _become_worker(req: Mapping[str, Any], fds: Sequence[int], pre: Preloaded) -> None:
    """In the forked child: own session, the parent's pipes on fds 0-2, the lane's environment."""
    from opgate.validators import worker

    t0 = time.perf_counter()
    code = 70
    try:
        _leave_server()
        channel = _take_pipes(req, fds)
        worker.arm()
        code = worker.serve_loop(channel, _for_request(pre, req), t0)
    except BaseException:  # noqa: BLE001 - a child must never return into the server's loop
        import traceback

        traceback.print_exc()
    finally:
        worker.exit_now(code)


def _become_standby(asked: Mapping[str, Any], sock: socket.socket, pre: Preloaded) -> None:
    """In a standby: start up with the environment ``asked`` had, say ready, wait for a run's request.

    The server's stderr is the standby's until a run takes it; then it is the
    worker that request would have forked, and its hello says how long its
    start-up took and how long it waited.  EOF (the server dropped it) ends it.
    """
    from opgate.validators import worker

    code = 70
    try:
        _leave_server()
        os.environ.clear()
        os.environ.update(asked["env"])
        worker.arm()
        kind = str(asked.get("kind") or pre.kind)
        t_start = time.perf_counter()
        if not worker.start_standby(kind):
            code = 3  # the device is not usable: no run should get this worker
            return
        startup_s = time.perf_counter() - t_start
        t_wait = time.perf_counter()
        msg, fds = await_run(sock)
        if not msg:
            code = 0
            return
        t0 = time.perf_counter()
        sock.close()
        req = json.loads(msg)
        channel = _take_pipes(req, fds)
        standby = {"startup_s": round(startup_s, 3), "waited_s": round(t0 - t_wait, 3)}
        unloaded = dataclasses.replace(pre, specs=None)  # type: ignore[arg-type]  # the run's, loaded now
        code = worker.serve_loop(channel, _for_request(unloaded, req), t0, standby)
    except BaseException:  # noqa: BLE001 - a child must never return into the server's loop
        import traceback

        traceback.print_exc()
    finally:
        worker.exit_now(code)


def await_run(sock: socket.socket) -> tuple[bytes, list[int]]:
    """In a standby that has started up: say ready, then wait for a run's request and its pipes.

    A run may have taken it while it was still starting (:meth:`_Loop._take_standby`):
    the server queued the request and closed its end, so saying ready fails and the
    request is read all the same.  ``b""``: the server dropped this standby.
    """
    with contextlib.suppress(OSError):
        sock.send(json.dumps({"ready": True}).encode())
    msg, fds, _, _ = socket.recv_fds(sock, MAX_MSG, 3)
    return msg, fds


def _send(sock: socket.socket, msg: Mapping[str, Any]) -> None:
    sock.send(json.dumps(msg).encode())
