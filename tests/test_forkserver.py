"""Workers forked from a preloaded fork server: fast, isolated, and their deaths still reported.

The runner's own runs (tests/test_runner_isolation.py, the zoo) go through the
fork server too; these tests pin the mechanics: each worker is a fork with its
own process group, a signal death reaches the pool as the signal, and a fork
server that cannot start leaves the run on fresh interpreters.
"""

from __future__ import annotations

import os
import selectors
import signal
import socket
from pathlib import Path

import pytest

from opgate.validators import forkloop
from opgate.validators.workerproc import Launcher, WorkerConfig, exit_description
from tests.workers import wait_hello

pytestmark = pytest.mark.integration


def test_forked_workers_start_fast_in_their_own_groups_and_report_signals(tmp_path: Path) -> None:
    launcher = Launcher(WorkerConfig(logs=tmp_path, fork_server=True))
    launcher.prestart(["cpu"])
    try:
        first = launcher.spawn("cpu-a-1", "cpu", None)
        second = launcher.spawn("cpu-a-2", "cpu", None)
        assert first.forked
        assert second.forked
        for worker in (first, second):
            hello = wait_hello(worker)
            assert float(hello["startup_s"]) < 1.0  # no torch import: it happened once, in the server
            assert os.getpgid(worker.pid) == worker.pid  # its own group: a kill takes its children
            assert hello["fingerprint"]["torch"]
        os.kill(first.pid, signal.SIGSEGV)
        assert exit_description(first.wait(timeout=10)) == "worker killed by SIGSEGV"
        second.close()  # polite stop: EOF on stdin
        assert second.wait(timeout=10) == 0
    finally:
        launcher.stop()


def test_workers_of_a_dead_fork_server_are_not_reused_and_a_new_worker_still_starts(tmp_path: Path) -> None:
    """SIGKILL the server: its idle workers die with it (no status can come) and must not get cells."""
    launcher = Launcher(WorkerConfig(logs=tmp_path, fork_server=True))
    launcher.prestart(["cpu"])
    try:
        idle = launcher.spawn("cpu-c-1", "cpu", None)
        wait_hello(idle)
        assert idle.alive
        server = launcher.servers["cpu"].proc
        assert server is not None  # the run's own server: this run started it
        os.kill(server.pid, signal.SIGKILL)
        server.wait(10)
        assert not idle.alive  # before its EOF is read: the pool must not hand it the re-run
        assert idle.wait(timeout=1) is None  # no exit status: nobody is left to report it
        assert exit_description(None).startswith("worker vanished")
        fresh = launcher.spawn("cpu-c-2", "cpu", None)  # the re-run's worker: a fresh interpreter
        assert not fresh.forked
        assert "fork server unusable" in fresh.log.read_text()
        assert wait_hello(fresh)["type"] == "hello"
        fresh.close()
        assert fresh.wait(timeout=30) == 0
    finally:
        launcher.stop()


def test_a_fork_server_that_cannot_start_leaves_fresh_interpreters(tmp_path: Path) -> None:
    """The torch-free stand-in worker knows no --fork-server: the launcher falls back, the run goes on."""
    cfg = WorkerConfig(logs=tmp_path, module="tests.fixtures_runner.fake_worker", fork_server=True)
    launcher = Launcher(cfg)
    launcher.prestart(["cpu"])
    try:
        worker = launcher.spawn("cpu-b-1", "cpu", None)
        assert not worker.forked
        assert "fork server unusable" in worker.log.read_text()
        assert wait_hello(worker)["type"] == "hello"
        worker.close()
        assert worker.wait(timeout=10) == 0
    finally:
        launcher.stop()


@pytest.mark.parametrize(
    ("plant", "logged"),
    [
        # forking after CUDA init gives workers that cannot use the GPU: the server must not serve then
        ("torch.cuda.is_initialized = lambda: True  # what an eager GPU import would leave",
         "CUDA initialised while preloading"),
        # is_available() marks later forks bad while is_initialized() stays False: only a real fork tells
        ("torch.cuda._is_in_bad_fork = lambda: True  # what asking the CUDA runtime leaves",
         "a forked child could not start CUDA"),
    ],
    ids=["cuda-initialised", "forks-poisoned"],
)  # fmt: skip
def test_a_fork_server_that_cannot_give_cuda_workers_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plant: str, logged: str
) -> None:
    """A server whose forks could not start CUDA must not serve: fresh interpreters do instead."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(f"import torch\n{plant}\n")
    monkeypatch.setenv("PYTHONPATH", f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    launcher = Launcher(WorkerConfig(logs=tmp_path / "logs", fork_server=True))
    launcher.prestart(["cpu"])
    try:
        worker = launcher.spawn("cpu-c-1", "cpu", None)
        assert not worker.forked
        assert wait_hello(worker)["type"] == "hello"  # a fresh interpreter serves instead
        assert logged in (tmp_path / "logs" / "forkserver-cpu.log").read_text()
        worker.close()
        worker.wait(timeout=10)
    finally:
        launcher.stop()


def test_forks_of_a_clean_process_are_usable() -> None:
    from opgate.validators.forkloop import _forks_poisoned

    assert _forks_poisoned() is False


def test_build_workers_fork_from_a_server_of_their_own(tmp_path: Path) -> None:
    """Builds start once torch and Triton are in, not after Inductor; never from the cpu server's Triton."""
    cfg = WorkerConfig(logs=tmp_path, module="tests.fixtures_runner.fake_worker", fork_server=True)
    for kinds, route in (
        (["build", "cuda"], {"build": "build", "cuda": "cuda"}),
        (["build", "cpu"], {"build": "build", "cpu": "cpu"}),
        (["build"], {"build": "build"}),
    ):
        launcher = Launcher(cfg)
        launcher.prestart(kinds)
        try:
            assert {kind: kind for kind in launcher.servers} == route  # each kind forks from its own
            assert sorted(launcher.servers) == sorted(set(route.values()))
        finally:
            launcher.stop()
    assert not Launcher(WorkerConfig(logs=tmp_path)).forks("cpu")  # no server: spares stay useful


PRECOMPUTED_PROBE = """
import gc, os, sys, threading
from opgate.validators import worker
worker.preload([], sys.argv[1], for_forks=True)
# the key hashing thread is done before any fork; what was imported is frozen for the collector
assert threading.active_count() == 1, threading.enumerate()
assert gc.isenabled() and gc.get_freeze_count() > 100_000, gc.get_freeze_count()
from triton.backends.nvidia.compiler import get_ptxas_version
from triton.runtime.cache import triton_key
before = (triton_key.cache_info().misses, get_ptxas_version.cache_info().currsize)
pid = os.fork()
if pid == 0:  # a worker: its first compile asks for the key, and must find it computed
    hits = triton_key.cache_info().hits
    triton_key()
    info = triton_key.cache_info()
    os._exit(0 if (info.hits, info.misses) == (hits + 1, 1) else 7)
_, status = os.waitpid(pid, 0)
print(before, os.waitstatus_to_exitcode(status))
"""


@pytest.mark.parametrize(("kind", "ptxas"), [("cuda", 2), ("build", 0)])
def test_a_forked_worker_inherits_the_compile_keys_its_server_computed(kind: str, ptxas: int) -> None:
    """Triton's key (a hash of libtriton.so) and ptxas' version are computed once, in the server.

    Without it every fresh worker computed them inside its first cell: on the
    H200, 0.45 s of a cudagraphs cell's fake_meta check and 0.3-0.7 s of its
    cudagraphs check (results/runs/h200-firstcell).  Not ptxas' version in the
    build server: its cells cross-compile with their own toolkit's ptxas.
    """
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", PRECOMPUTED_PROBE, kind],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    # computed once before the fork (one miss; sm_80 and sm_90 ptxas), then only hits in the child (exit 0)
    assert done.stdout.strip().splitlines()[-1] == f"(1, {ptxas}) 0", done.stdout + done.stderr[-2000:]


def _standby(pid: int, key: str, *, ready: bool) -> tuple[forkloop._Standby, socket.socket]:
    """A standby's record in the server (its end of a real socket pair) and the standby's end.

    ``pid`` only names the record: nothing here signals it.
    """
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    return forkloop._Standby(pid=pid, sock=ours, key=key, ready=ready), theirs


def test_a_run_takes_a_ready_standby_first_then_one_still_starting_never_another_environments() -> None:
    """Back-to-back runs: the next asks before its standbys are ready; it must not fork beside them.

    The request is queued in the starting standby's socket and the server closes
    its end; the standby, once started, fails to say ready and reads the request
    with its pipes all the same (``await_run``, what a real standby calls).
    """
    loop = forkloop._Loop.__new__(forkloop._Loop)  # the event loop's state, without its signal set-up
    loop.sel = selectors.DefaultSelector()
    starting, starting_end = _standby(1, "cuda|gpu0", ready=False)
    ready, ready_end = _standby(2, "cuda|gpu0", ready=True)
    other, other_end = _standby(3, "cuda|gpu1", ready=True)
    loop.standby = {standby.pid: standby for standby in (starting, ready, other)}
    for standby in loop.standby.values():
        loop.sel.register(standby.sock, selectors.EVENT_READ, standby)
    pipes = [os.pipe() for _ in range(3)]
    fds: list[int] = []
    try:
        assert loop._take_standby("cuda|gpu0", b'{"n": 1}', [pipes[0][1]]) is ready
        assert loop._take_standby("cuda|gpu0", b'{"n": 2}', [pipes[1][1]]) is starting
        assert loop._take_standby("cuda|gpu0", b'{"n": 3}', [pipes[2][1]]) is None  # none left: a fork
        assert list(loop.standby.values()) == [other]  # another GPU's standby is not this run's
        assert ready.sock.fileno() == -1  # handed over, closed here
        assert starting.sock.fileno() == -1

        msg, fds = forkloop.await_run(starting_end)  # it finished starting after the run took it
        assert msg == b'{"n": 2}'
        os.write(fds[0], b"hello")  # the run's pipe, passed through the queued message
        assert os.read(pipes[1][0], 5) == b"hello"
        msg, more = forkloop.await_run(ready_end)
        assert msg == b'{"n": 1}'
        fds += more

        other.sock.close()  # what the server does to a standby nobody takes: it reads EOF and ends
        assert forkloop.await_run(other_end) == (b"", [])
    finally:
        for fd in [*fds, *(fd for pair in pipes for fd in pair)]:
            os.close(fd)
        for end in (starting_end, ready_end, other_end):
            end.close()


def test_a_fork_server_whose_socket_broke_gives_up_forking_and_leaks_no_pipe(tmp_path: Path) -> None:
    """A send that fails (the server died) closes the four pipe ends it made, and no later worker
    asks that server again: each starts as a fresh interpreter at once."""
    import json

    from opgate.validators.forkserver import ForkServer

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    theirs.send(json.dumps({"ready": True}).encode())
    server = ForkServer(["python"], {}, tmp_path / "server.log", connection=ours)
    assert server.wait_ready(5.0)
    theirs.close()  # the server is gone
    before = sorted(p.name for p in Path("/proc/self/fd").iterdir())
    with pytest.raises(OSError):  # noqa: PT011 - BrokenPipeError or ConnectionResetError, the kernel's choice
        server.fork({}, tmp_path / "w.log")
    assert sorted(p.name for p in Path("/proc/self/fd").iterdir()) == before
    assert server.failed.startswith("fork server gone")
    with pytest.raises(OSError, match="fork server gone"):
        server.fork({}, tmp_path / "w.log")  # asked again: refused without a send
    assert sorted(p.name for p in Path("/proc/self/fd").iterdir()) == before
    ours.close()
