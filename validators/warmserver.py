"""Warm fork servers: one run's torch/Triton/Dynamo imports kept for the next (``--keep-warm``).

Why: a fork server spends seconds importing before its first worker can start
(the H200 host's cuda server: 3.4-4.0 s with a bytecode cache, 14 s without),
and a run that re-validates one changed op does
little more than that.  With ``opgate run --keep-warm MINUTES`` the run's
fork servers stay up after it, and the next run on this machine with the same
interpreter and environment forks its workers from them at once.  The way a
developer iterates on a kernel (edit, ``opgate run --changed-since main``,
edit again), or a persistent GPU runner gates pull requests, pays the imports
once.

What keeps a warm server honest:

* Only imports are kept.  No op module, no CUDA context, no cell ever runs in
  the server (it refuses to serve if CUDA got initialised); every worker is a
  fresh fork with the run's own environment, working folder and specs (loaded
  per run, so an edited ``spec.yaml`` is seen).  A lane's first worker may be
  a standby the last run left (:mod:`validators.forkloop`): a fork that made
  its CUDA context before the run, and gets the run's environment, folder
  and specs when the run takes it.
* It is found by a key over what shapes an import: the interpreter, the
  worker's arguments and the environment variables torch, Triton, CUDA,
  Python and opgate read (``KEYED_PREFIXES``).  Anything else in the
  environment is passed to each worker, as in a run's own server.
* It checks itself before each run: if a file of any module it imported, or
  a folder on its ``sys.path``, changed since its imports (opgate upgraded,
  torch reinstalled, a validator edited), it answers ``stale``, stops
  listening and exits once its runs are done; the run starts a fresh one.
* A worker still dies with its run: when a run's connection closes (the run
  ended, crashed or was killed), the server kills that run's workers.
* It exits after ``MINUTES`` with no run and no worker; ``opgate servers
  --stop`` stops every one now.

The servers live in ``$OPGATE_SERVER_DIR``, else ``$XDG_RUNTIME_DIR/opgate``,
else ``/tmp/opgate-<uid>`` (mode 0700, owned by the user, or not used at all).
Anything that goes wrong here leaves the run on its own fork servers.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from opgate.matrix.files import exclusive
from opgate.validators.forkserver import ForkServer
from opgate.validators.tritonvariants import RUN_VARIABLE

#: Environment variables that can shape what a server imports (read at import time by torch,
#: Inductor, Triton, the CUDA libraries, Python itself or opgate): part of the server's key.
KEYED_PREFIXES = (
    "TORCH",
    "PYTORCH",
    "TRITON",
    "CUDA",
    "NVIDIA",
    "OPGATE",
    "PYTHON",
    "LD_",
    "OMP_",
    "MKL_",
    "KMP_",
    "VIRTUAL_ENV",
    "CONDA",
)
KEYED_NAMES = frozenset({"PATH", "HOME", "TMPDIR", "CC", "CXX"})
#: Variables that name one run's own files: a worker reads them when it takes the run's request,
#: never at import, and a key holding them would match no later run.
RUN_SCOPED = frozenset({RUN_VARIABLE})
#: AF_UNIX paths are limited to 108 bytes on Linux.
MAX_SOCKET_PATH = 100
CONNECT_TIMEOUT_S = 30.0


def server_dir() -> Path | None:
    """The folder warm servers live in, created private; None if it is not safely ours."""
    uid = os.getuid()
    chosen = os.environ.get("OPGATE_SERVER_DIR")
    if chosen:
        path = Path(chosen)
    elif os.environ.get("XDG_RUNTIME_DIR"):
        path = Path(os.environ["XDG_RUNTIME_DIR"]) / "opgate"
    else:
        path = Path(tempfile.gettempdir()) / f"opgate-{uid}"
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = path.stat()
    except OSError:
        return None
    if st.st_uid != uid or st.st_mode & 0o077:
        return None  # someone else's, or open to others: a socket there could be anyone's
    return path


def keyed(env: Mapping[str, str]) -> list[tuple[str, str]]:
    """The variables of ``env`` that can shape what a server or standby imports, sorted."""
    return sorted(
        (k, v)
        for k, v in env.items()
        if (k in KEYED_NAMES or k.startswith(KEYED_PREFIXES)) and k not in RUN_SCOPED
    )


def key(argv: Sequence[str], env: Mapping[str, str]) -> str:
    """What a warm server must share with a run to serve it (16 hex digits)."""
    blob = json.dumps([os.path.realpath(argv[0]), list(argv[1:]), keyed(env)])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def server_argv(argv: Sequence[str]) -> list[str]:
    """The worker's arguments without its ``--ops-path`` values (a warm server loads specs per run)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--ops-path":
            skip = True
        else:
            out.append(arg)
    return out


def _locked(path: Path) -> contextlib.AbstractContextManager[None]:
    """One run at a time decides whether to start the server at ``path`` (no two start it)."""
    return exclusive(path.with_suffix(".lock"))


def _connect(path: Path) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.connect(str(path))
    except OSError:
        sock.close()
        return None
    return sock


def connect(
    argv: Sequence[str],
    env: Mapping[str, str],
    log: Path,
    *,
    kind: str,
    idle_s: float,
    ops_paths: Sequence[Path],
) -> ForkServer | None:
    """A warm server for this worker's ``argv`` and ``env``: reused, else started; None: use a run's own."""
    folder = server_dir()
    argv = server_argv(argv)
    if folder is None:
        _note(log, "no private folder for warm servers; this run starts its own")
        return None
    path = folder / f"{kind}-{key(argv, env)}.sock"
    if len(str(path)) > MAX_SOCKET_PATH:
        _note(log, f"warm server path too long for a socket ({path}); set OPGATE_SERVER_DIR shorter")
        return None
    request = {"ops_paths": [str(Path(p).resolve()) for p in ops_paths], "cwd": str(Path.cwd())}
    with _locked(path):
        sock = _connect(path)
        server = ForkServer(argv, env, log, connection=sock, request=request) if sock is not None else None
        if server is not None:
            server.hear(1.0)
            if server.stale or server.closed:
                why = server.stale or "it hung up"
                _note(log, f"warm server {path.name} was stale ({why}); starting a new one")
                server.stop()
                server = None
        if server is None:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # a stale path (its server gone, or stopping)
            proc = _spawn(argv, env, path, idle_s)
            sock = _await_listening(path, proc)
            if sock is None:
                why = f"warm server did not start (see {path.with_suffix('.log')})"
                _note(log, f"{why}; this run starts its own")
                return None
            server = ForkServer(argv, env, log, connection=sock, proc=proc, request=request)
    _note(
        log,
        f"{'started' if server.proc is not None else 'reusing'} warm server {path} (idle exit {idle_s:g} s)",
    )
    return server


def _spawn(argv: Sequence[str], env: Mapping[str, str], path: Path, idle_s: float) -> subprocess.Popen[bytes]:
    with path.with_suffix(".log").open("ab") as err:
        return subprocess.Popen(
            [*argv, "--fork-server-listen", str(path), "--idle-s", f"{idle_s:g}"],
            stdin=subprocess.DEVNULL,
            stdout=err,
            stderr=err,
            env=dict(env),
            cwd="/",  # holds no run's folder open
            start_new_session=True,  # outlives this run, and no terminal's Ctrl-C reaches it
        )


def _await_listening(path: Path, proc: subprocess.Popen[bytes]) -> socket.socket | None:
    """Connect once the new server has bound its path (before its imports: ~0.1 s)."""
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    while time.monotonic() < deadline:
        sock = _connect(path)
        if sock is not None:
            return sock
        if proc.poll() is not None:
            return None
        time.sleep(0.02)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    return None


def _note(log: Path, line: str) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as f:
        f.write(f"opgate: {line}\n")


def servers() -> list[dict[str, Any]]:
    """The warm servers this user has: kind, pid, path, started, idle exit (their ``.json`` notes)."""
    folder = server_dir()
    found = []
    for note in sorted(folder.glob("*.json")) if folder is not None else []:
        try:
            info = json.loads(note.read_text())
            os.kill(int(info["pid"]), 0)
        except (OSError, ValueError, KeyError, TypeError):
            continue  # gone without tidying up (SIGKILL): the next run's connect cleans its socket
        found.append(info)
    return found


def stop_all() -> list[dict[str, Any]]:
    """SIGTERM every warm server (their workers die with them); what was stopped."""
    stopped = []
    for info in servers():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(int(info["pid"]), signal.SIGTERM)
            stopped.append(info)
    return stopped


def main_servers(stop: bool) -> int:
    """``opgate servers [--stop]``: list (or stop) the warm servers."""
    found = stop_all() if stop else servers()
    verb = "stopped" if stop else "warm"
    for info in found:
        age = time.time() - float(info.get("started", time.time()))
        print(
            f"{verb}: {info.get('kind')} server pid {info.get('pid')}, up {age:.0f} s, "
            f"idle exit {info.get('idle_s')} s, {info.get('path')}"
        )
    if not found:
        print("no warm servers" if not stop else "no warm servers to stop")
    print(f"folder: {server_dir()}", file=sys.stderr)
    return 0
