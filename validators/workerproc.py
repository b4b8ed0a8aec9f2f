"""The parent's handle on one worker process, and how a worker of each kind is started.

Kept apart from the scheduler (:mod:`validators.pool`) so that the process
mechanics (own process group, non-blocking JSON-line reads, stack dump then
SIGKILL of the whole group) are in one small place.  The environment per
kind is decided here because it must be fixed *before* the worker imports
torch/triton: ``TRITON_INTERPRET=1`` and no GPUs for cpu workers, one
``CUDA_VISIBLE_DEVICES`` index per cuda worker.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opgate.validators import compilercache, tritoncache, warmserver
from opgate.validators.device import Gpu
from opgate.validators.env import DEVICE_ORDER
from opgate.validators.forkserver import ForkedProcess, ForkServer
from opgate.validators.worker import BUILD_ENV, CPU_ENV

#: Worker kinds that compile C++ with Inductor (torch.compile, AOTInductor): their compiler goes
#: through ccache.  A build worker compiles with nvcc and cpp_extension's own cache.
COMPILING_KINDS = frozenset({"cpu", "cuda"})
#: The kinds that compile Triton kernels for a GPU (a cpu worker interprets them).
TRITON_COMPILING_KINDS = frozenset({"cuda", "build"})
#: A GPU worker's defaults (the user's own values win).  ``OPGATE_REPLAY_BUILD=wait``: opgate's
#: Triton ops take their C++ launch-replay path from the first call (``opgate.ops._replay``).
#: Left to build in the background, the library landed mid-run: cells forked after that took
#: the replay path, earlier ones the Python path, and verdicts depended on the timing.
GPU_ENV_DEFAULTS: Mapping[str, str] = {"OPGATE_REPLAY_BUILD": "wait"}
#: Signals a worker gets from outside, never from a fault of the op it runs: the OOM killer and
#: the parent's death (PR_SET_PDEATHSIG) send SIGKILL, operators and schedulers SIGTERM/INT/HUP/QUIT.
EXTERNAL_SIGNALS = frozenset({signal.SIGKILL, signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGQUIT})


def killed_from_outside(returncode: int | None) -> bool:
    """True when the exit status says something outside the cell ended the worker.

    A SIGSEGV, SIGBUS, SIGFPE, SIGILL or SIGABRT is the op's own crash (a re-run
    that passes makes it ``flaky``); a SIGKILL/SIGTERM, or no status at all (a
    forked worker whose fork server died cannot be reaped), is not: such a cell
    is ``error`` naming it, whatever a re-run does.
    """
    if returncode is None:
        return True
    return returncode < 0 and -returncode in EXTERNAL_SIGNALS


def exit_description(returncode: int | None) -> str:
    """``-11`` -> "worker killed by SIGSEGV"; ``3`` -> "worker exited with code 3"."""
    if returncode is None:
        return "worker vanished (no exit status: its fork server is gone)"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            return f"worker killed by signal {-returncode}"
        outside = " from outside the cell" if killed_from_outside(returncode) else ""
        return f"worker killed by {name}{outside}"
    return f"worker exited with code {returncode}"


def _descendant_groups(pid: int) -> list[int]:
    """The process groups, other than ``pid``'s own, of the live processes below ``pid`` (Linux).

    A build cell's cross-compile runs in a fork that leads a session of its own
    (:mod:`validators.forkchild`, so its own timeout takes the compilers it
    started); killing the worker's group alone leaves those compilers running
    after the cell's timeout.  Read while the worker is alive, so each pid is
    still its process's; nothing where ``/proc`` cannot say.
    """
    groups: list[int] = []
    todo, seen = [pid], {pid}
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*/children"):
            with contextlib.suppress(OSError, ValueError):
                for child in map(int, task.read_text().split()):
                    if child not in seen:
                        seen.add(child)
                        todo.append(child)
    for child in seen - {pid}:
        with contextlib.suppress(OSError):
            group = os.getpgid(child)
            if group != pid and group not in groups and group != os.getpgrp():
                groups.append(group)
    return groups


def worker_name(kind: str, lane: str, n: int) -> str:
    """``cuda-gpu0.1-7``: the n-th worker of a run, on ``lane`` (0: started before the pool, see
    ``Launcher.prefork``); the run breakdown reads the lane back from it."""
    return f"{kind}-{lane}-{n}"


class WorkerProcess:
    """Parent-side handle: spawn, send a task, read replies without blocking, kill."""

    def __init__(
        self,
        name: str,
        kind: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        log: Path,
        *,
        server: ForkServer | None = None,
        standby: bool = False,
    ) -> None:
        self.name, self.kind, self.log = name, kind, log
        log.parent.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen[bytes] | ForkedProcess
        self.forked = False
        if server is not None:
            try:
                self.proc, self.forked = server.fork(env, log, kind, standby=standby), True
            except OSError as exc:
                with log.open("a") as f:
                    f.write(f"fork server unusable ({exc}); starting a fresh interpreter\n")
        if not self.forked:
            with log.open("ab") as err:
                self.proc = subprocess.Popen(
                    list(argv),
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=err,
                    env=dict(env),
                    start_new_session=True,  # own process group: a kill takes its children too
                )
        assert self.proc.stdout is not None
        self.fd = self.proc.stdout.fileno()
        os.set_blocking(self.fd, False)
        self.started = time.monotonic()
        self.ready_at = 0.0
        self.ready = False
        self.eof = False
        self.fingerprint: dict[str, Any] = {}
        self.startup_s = 0.0
        self.standby: dict[str, Any] = {}  # a warm server's standby: its warm-up and wait (hello)
        self.cells: list[str] = []
        self.end = ""
        self.garbled = 0
        self.retiring = False  # stdin closed on purpose: an exit before hello is no start-up failure
        self._buf = b""
        self._reaped = False  # waited for, its group killed: its pid is no longer ours to signal
        self.released = False  # its pipes closed (release): its fd number is no longer its own

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        """Running and usable; a forked worker whose fork server died is not (it dies with its server)."""
        if isinstance(self.proc, ForkedProcess) and self.proc.orphaned:
            return False
        return not self.eof and not self.retiring and self.proc.poll() is None

    def hello(self, msg: Mapping[str, Any]) -> None:
        self.ready = True
        self.ready_at = time.monotonic()
        self.startup_s = float(msg.get("startup_s", 0.0))
        self.fingerprint = dict(msg.get("fingerprint") or {})
        self.standby = dict(msg.get("standby") or {})

    def send(self, msg: Mapping[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(msg) + "\n").encode())
        self.proc.stdin.flush()

    def read(self) -> list[dict[str, Any]]:
        """Complete messages available now; sets ``eof`` when the worker closed its end."""
        while True:
            try:
                chunk = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                break
            if not chunk:
                self.eof = True
                break
            self._buf += chunk
        *lines, self._buf = self._buf.split(b"\n")
        messages = []
        for line in lines:
            try:
                msg = json.loads(line)
            except ValueError:
                msg = None
            if isinstance(msg, dict):
                messages.append(msg)
            elif line.strip():
                self.garbled += 1  # not the protocol: never trusted, never fatal to the run
        return messages

    def dump_stacks(self) -> None:
        if self._reaped or self.proc.poll() is not None:  # gone: its pid may be another process's
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGUSR1)

    @property
    def left_to_server(self) -> bool:
        """A warm server's fork: the server kills and reaps it once the run lets go of the server."""
        return isinstance(self.proc, ForkedProcess) and self.proc.left_to_server

    def kill_group(self) -> None:
        """SIGKILL the worker's process group (it and whatever it started), without waiting.

        Not once the worker was reaped: its group was killed then, and its pid
        (every worker leads its own group) may belong to another process by now,
        another run's worker say.
        """
        if not self._reaped:
            for group in _descendant_groups(self.proc.pid):  # started in sessions of their own
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(group, signal.SIGKILL)
            self._killpg()

    def _killpg(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def kill(self) -> int | None:
        self.kill_group()
        return self.wait()

    def wait(self, timeout: float = 10.0) -> int | None:
        """Reap the worker (killing it after ``timeout``), then, once, whatever it left in its group."""
        if self._reaped:
            return self.proc.returncode
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._killpg()
            try:
                rc = self.proc.wait(timeout)
            except subprocess.TimeoutExpired:  # a forked worker whose fork server is gone
                rc = None
        self._killpg()  # e.g. Inductor compile subprocesses orphaned by a crash: right at the reap
        self._reaped = rc is not None
        return rc

    def release(self) -> None:
        """Close the parent's pipe ends (after the worker is gone): ``fd`` may be another pipe's next."""
        for pipe in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError, ValueError):
                if pipe is not None:
                    pipe.close()
        self.released = True

    def close(self) -> None:
        """Polite stop: EOF on stdin ends the serve loop."""
        with contextlib.suppress(OSError, ValueError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()

    def record(self, t0: float) -> dict[str, Any]:
        """For run.json: which cells it served, how it ended, and when (s since ``t0``)."""
        record = {
            "name": self.name,
            "kind": self.kind,
            "pid": self.pid,
            "spawned_s": round(self.started - t0, 3),
            "ready_s": round(self.ready_at - t0, 3) if self.ready else None,
            "startup_s": self.startup_s,
            "cells": self.cells,
            "end": self.end or exit_description(self.proc.returncode),
        }
        if self.standby:  # started and warmed up before this run: not in its start-up
            record["standby"] = self.standby
        return record


@dataclass
class WorkerConfig:
    """How to start a worker: interpreter, entry module, op folders, threads, where its stderr goes.

    ``module`` speaks the protocol of :mod:`validators.worker`; the pool's own
    tests swap in a torch-free stand-in to exercise scheduling in milliseconds.
    """

    logs: Path
    ops_paths: Sequence[Path] = ()
    threads: int = 0
    python: str = sys.executable
    module: str = "opgate.validators.worker"
    extra_env: Mapping[str, str] = field(default_factory=dict)
    fork_server: bool = False  # fork workers from one preloaded process per kind
    #: keep the fork servers warm for later runs, exiting after this long idle (0: the run's own)
    keep_warm_s: float = 0.0
    #: Inductor's compile processes per worker.  A run's parallelism is across cells (one per
    #: lane); a cell compiles a graph of a few kernels, and a pool would cost every worker a
    #: side process that imports torch again, and seconds at exit.  None: Inductor decides.
    compile_threads: int | None = 1

    def argv(self, kind: str) -> list[str]:
        argv = [self.python, "-m", self.module, "--kind", kind, "--threads", str(self.threads)]
        for p in self.ops_paths:
            argv += ["--ops-path", str(p)]
        return argv

    def env(self, kind: str, gpu: Gpu | None) -> dict[str, str]:
        env = {**os.environ, **self.extra_env, "PYTHONUNBUFFERED": "1"}
        if self.threads:
            env["OMP_NUM_THREADS"] = str(self.threads)
        if self.compile_threads is not None:
            env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(self.compile_threads))  # read at import
        if kind == "cpu":
            env.update(CPU_ENV)
        elif kind == "build":
            env.update(BUILD_ENV)
            env.pop("TRITON_INTERPRET", None)
        else:
            env.pop("TRITON_INTERPRET", None)
            env.update(DEVICE_ORDER)  # the numbering the GPU list was made with
            for key, value in GPU_ENV_DEFAULTS.items():
                env.setdefault(key, value)
            env["CUDA_VISIBLE_DEVICES"] = visible_device(gpu.index if gpu else 0)
        if kind in COMPILING_KINDS:  # before the worker imports Inductor, which reads CXX then
            env.update(self.compiler_cache(env).env)
        if kind in TRITON_COMPILING_KINDS:  # lanes side by side compile each Triton kernel once
            env.update(tritoncache.worker_env(env))
        return env

    def compiler_cache(self, env: Mapping[str, str] | None = None) -> compilercache.CompilerCache:
        """How the workers' C++ compiles are cached (:mod:`validators.compilercache`; memoised)."""
        return compilercache.worker_env({**os.environ, **self.extra_env} if env is None else env)


def visible_device(index: int, parent: str | None = None) -> str:
    """The ``CUDA_VISIBLE_DEVICES`` value that shows a worker the parent's GPU ``index`` alone.

    The probe numbers GPUs as the parent sees them; when the parent itself runs
    under ``CUDA_VISIBLE_DEVICES=2,3``, its GPU 0 is physical 2 (or a UUID).
    """
    parent = os.environ.get("CUDA_VISIBLE_DEVICES") if parent is None else parent
    listed = [d.strip() for d in (parent or "").split(",") if d.strip()]
    return listed[index] if index < len(listed) else str(index)


class Launcher:
    """Starts workers: forked from a preloaded fork server when configured, else fresh interpreters.

    The servers a run needs are started together, as soon as the runner knows
    which kinds of cells will run (their imports overlap with each other and
    with the runner's cache look-ups), and stopped after the last worker is
    reaped.  Each kind has its own server: a build server imports only torch
    and Triton, so on a GPU run the build cells (and the nvcc builds the CUDA
    C++ ops' cells would otherwise wait for) start while the cuda server is
    still importing Dynamo and Inductor.  Never a build worker from the cpu
    server: Triton imported under ``TRITON_INTERPRET=1`` cannot compile for a GPU.
    """

    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.servers: dict[str, ForkServer] = {}
        #: workers started before the pool exists, by lane name (:meth:`prefork`); the pool adopts them
        self.preforked: dict[str, WorkerProcess] = {}
        self.preload_s: dict[str, float] = {}  # per server kind: its imports (run.json)
        self.warm: dict[str, str] = {}  # per warm server kind: "started" by this run or "reused"

    def prestart(self, kinds: Sequence[str]) -> None:
        """Start the servers for ``kinds`` (all the kinds the run needs, when known)."""
        if not self.config.fork_server:
            return
        cfg = self.config
        for kind in sorted(kinds):
            if kind not in self.servers:
                log = cfg.logs / f"forkserver-{kind}.log"
                argv, env = cfg.argv(kind), cfg.env(kind, None)
                warm = None
                if cfg.keep_warm_s > 0:
                    warm = warmserver.connect(
                        argv, env, log, kind=kind, idle_s=cfg.keep_warm_s, ops_paths=cfg.ops_paths
                    )
                self.servers[kind] = warm or ForkServer(argv, env, log)

    def startable(self, kind: str) -> bool:
        """Whether a worker of ``kind`` starts without waiting for its server's imports."""
        server = self.servers.get(kind)
        return server is None or server.poll_ready()

    def importing(self) -> bool:
        """Whether some server is still importing (cells of its kind wait for it)."""
        return not all(server.poll_ready() for server in self.servers.values())

    def forks(self, kind: str) -> bool:
        """Whether workers of ``kind`` are forked (a server was started for it and has not failed)."""
        server = self.servers.get(kind)
        return server is not None and not server.failed

    def spawn(self, name: str, kind: str, gpu: Gpu | None, *, fresh: bool = False) -> WorkerProcess:
        """A worker of ``kind``; ``fresh`` (an isolated cell's, a re-run's) never a warm server's standby."""
        cfg = self.config
        server = self.servers.get(kind)
        log = cfg.logs / f"{name}.log"
        env = cfg.env(kind, gpu)
        return WorkerProcess(name, kind, cfg.argv(kind), env, log, server=server, standby=not fresh)

    def prefork(self, kind: str, lanes: Sequence[tuple[str, Gpu | None]]) -> None:
        """Start the first worker of each of ``lanes`` now, before the pool exists.

        The runner calls this while it still serves cached verdicts and orders
        the cells, once the server of ``kind`` is ready (a warm one): a GPU
        worker spends 0.3 s alone, 2 s beside 15 others, making its CUDA
        context before it can take a cell, and that no longer waits for the
        plan.  The pool adopts each as its lane's worker (:meth:`adopt`); one
        it never adopts is stopped with the servers.
        """
        for lane, gpu in lanes:
            if lane not in self.preforked:
                self.preforked[lane] = self.spawn(worker_name(kind, lane, 0), kind, gpu)

    def adopt(self, lane: str) -> WorkerProcess | None:
        """The worker started early for ``lane`` (:meth:`prefork`), handed over once."""
        return self.preforked.pop(lane, None)

    def _drop_preforked(self) -> None:
        """Stop the early workers no lane took: EOF, then SIGKILL (a warm server's forks: the server)."""
        for worker in self.preforked.values():
            worker.retiring, worker.end = True, "started early, not needed"
            worker.close()
            if not worker.left_to_server:
                worker.kill()
            worker.release()
        self.preforked.clear()

    def stop(self) -> None:
        self._drop_preforked()
        for kind, server in self.servers.items():
            self.preload_s[kind] = server.preload_s if server.ready else 0.0
            if server.warm:
                self.warm[kind] = "reused" if server.reused else "started"
            server.stop()
        self.servers.clear()
