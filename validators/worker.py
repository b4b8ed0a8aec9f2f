"""A long-lived worker process that runs cells, and the parent's handle on it.

Why a process per worker, reused across cells: importing torch (and warming
Triton, Inductor) costs seconds, so one process serves many cells of the same
environment; but a cell may segfault (AOTInductor loaders do), hang, or leave a
sticky CUDA error, so the *process* is the unit of failure.  When it dies, only
the cell it was running is charged (``error``, naming the signal), and the pool
starts a fresh one.

Protocol, JSON lines: the parent writes tasks to the worker's stdin; the worker
answers on a private copy of its original stdout (fd 1 itself is pointed at
stderr, so an op that prints cannot corrupt the channel).  Messages::

    worker -> {"type": "hello", "pid", "kind", "startup_s", "fingerprint"}
    parent -> {"cell", "seed", "attempt", "log", "workdir", "timeout_s"}
    worker -> {"type": "built", "id"}   (a build cell: what GPU cells load is built; the cell goes on)
    worker -> {"type": "result", "id", "outcome": {checks, kernels, reason, verdict}, "duration_s",
               "healthy", "unhealthy_reason"}

While a cell runs, fds 1 and 2 point at its log file, so Python tracebacks,
C-level prints and faulthandler's dump of a crash or hang land in
``DIR/logs/<id>.log``.  The parent stops a worker by closing stdin, and kills a
hung one (whole process group) after a ``SIGUSR1`` stack dump.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import faulthandler
import json
import math
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NoReturn

from opgate.validators import limits, tritonvariants
from opgate.validators.options import switched_off

#: Process-wide switches a worker must have before torch/triton are imported.
CPU_ENV = {"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
BUILD_ENV = {"CUDA_VISIBLE_DEVICES": ""}


def jsonable(value: Any) -> Any:
    """Strict-JSON form of check details: NaN/Inf become strings (browsers reject bare NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, (str, int, bool)):
        return value
    item = getattr(value, "item", None)  # numpy / torch scalars
    if callable(item):
        with contextlib.suppress(Exception):
            return jsonable(item())
    return str(value)


def outcome_json(outcome: Any) -> dict[str, Any]:
    """``validators.checks.CellOutcome`` -> wire form (the parent rebuilds CheckResults)."""
    verdict = getattr(outcome, "verdict", None)
    return {
        "checks": [jsonable(c.to_json()) for c in outcome.checks],
        "kernels": [str(k) for k in outcome.kernels],
        "reason": str(getattr(outcome, "reason", "") or ""),
        "verdict": None if verdict is None else str(getattr(verdict, "value", verdict)),
        "setup_build_s": float(getattr(outcome, "setup_build_s", 0.0) or 0.0),
        "setup_wait_s": float(getattr(outcome, "setup_wait_s", 0.0) or 0.0),
    }


def error_outcome(reason: str) -> dict[str, Any]:
    return {"checks": [], "kernels": [], "reason": reason, "verdict": "error"}


def die_with_parent() -> None:
    """Linux: SIGKILL this worker if the parent dies, so no orphan holds a GPU."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@contextlib.contextmanager
def _output_to(path: Path) -> Iterator[None]:
    """Point fds 1 and 2, and ``sys.stdout``/``sys.stderr``, at ``path`` for the duration.

    File descriptors catch C-level output (and faulthandler's crash dump);
    the Python streams are swapped too, in case a library replaced them.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    saved = (os.dup(1), os.dup(2))
    streams = (sys.stdout, sys.stderr)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - closed in finally
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    try:
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
            stream.close()
        sys.stdout, sys.stderr = streams
        for target, copy in zip((1, 2), saved, strict=True):
            os.dup2(copy, target)
            os.close(copy)


def _health(kind: str, *, tidy: bool = True) -> str:
    """Why the device is no longer usable (a sticky CUDA error poisons every later cell), or "".

    ``tidy`` also hands the cell's cached blocks back for the next cell; a
    throw-away worker (its last cell) skips that, and the between-cells reset.
    """
    if kind != "cuda":
        return ""
    import torch

    try:
        torch.cuda.synchronize()
        torch.ones(1, device="cuda").add_(1).item()
        if tidy:
            torch.cuda.empty_cache()
    except Exception as exc:  # noqa: BLE001 - any failure here means the context is gone
        return f"sticky CUDA error after this cell: {type(exc).__name__}: {str(exc).splitlines()[0]}"
    return ""


def _reset_between_cells() -> None:
    """Give the next cell what a fresh process would: no compiled graphs, no cached guards."""
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        with contextlib.suppress(Exception):
            dynamo.reset()
    # CUDA graph trees (cudagraphs cells) hold graph pools and recorded state per device.
    # ``dynamo.reset`` clears them only through the compile wrappers it still caches; the
    # trees are reset here in any case, so a cudagraphs cell starts from none.
    trees = sys.modules.get("torch._inductor.cudagraph_trees")
    if trees is not None:
        with contextlib.suppress(Exception):
            trees.reset_cudagraph_trees()


RunCell = Callable[..., Any]
#: Imported before the first cell's timeout starts (and, with a fork server, once per run
#: before any fork), by the kind of worker.  A cell would otherwise import them on first use,
#: in every worker, inside its first check: Inductor's compiler, export and opcheck's
#: machinery are seconds of imports a worker pays once.  None of them touches the GPU (a
#: server whose imports initialised CUDA refuses to serve, see ``forkserver``).  A build
#: worker runs its compilers in child processes and needs torch and Triton only.
PRELOAD: Mapping[str, tuple[str, ...]] = {
    "build": ("triton",),  # forked cross-compile children need it imported (validators.forkchild)
    "cpu": (
        "triton",
        "torch._dynamo",
        "torch._inductor.compile_fx",
        "torch._functorch.partitioners",
        "torch.export",
        "torch.testing._internal.optests",
        "torch.profiler",
        # what every worker's first cell still imported (sys.modules before and after one cell of
        # each mode in a fork of this preload): Triton's code generator (a JIT launch), export's
        # tracer, the shape-guard validator and sympy's combinatorics (Dynamo and export)
        "triton.compiler.code_generator",
        "torch.export._trace",
        "torch.fx.experimental.validator",
        "sympy.combinatorics",
    ),
}
PRELOAD_DEFAULT = PRELOAD["cpu"]


def run_task(
    task: Mapping[str, Any], specs: Mapping[str, Any], run_cell: RunCell, kind: str
) -> dict[str, Any]:
    """Run one cell in this process; always returns a result message (crashes kill us instead)."""
    from opgate.matrix.cell import Cell

    cell = Cell.from_json(task["cell"])
    log = Path(task["log"])
    workdir = Path(task["workdir"])
    workdir.mkdir(parents=True, exist_ok=True)
    device = "cuda:0" if kind == "cuda" else "cpu"
    t0 = time.perf_counter()
    unhealthy = ""
    with _output_to(log):
        print(
            f"=== {cell.id} attempt {task['attempt']} seed {task['seed']} "
            f"worker pid {os.getpid()} ({kind}, {device})",
            file=sys.stderr,
            flush=True,
        )
        spec = specs.get(cell.op)
        if spec is None:
            outcome = error_outcome(f"op {cell.op!r} has no spec in this worker")
        else:
            root = str(getattr(spec, "root", "") or "")
            if root and root not in sys.path:
                sys.path.insert(0, root)
            memory_mb = task.get("memory_mb")
            tritonvariants.set_current(f"{cell.op}.{cell.impl}", cell.id)  # what it compiles: its op's
            try:
                with limits.limited(memory_mb):
                    outcome = outcome_json(run_cell(cell, spec, device, int(task["seed"]), workdir))
            except Exception as exc:  # noqa: BLE001 - a validator bug must not take other cells down
                traceback.print_exc()
                first = (str(exc).splitlines() or [""])[0][:300]
                outcome = error_outcome(f"validator raised {type(exc).__name__}: {first}")
            finally:
                tritonvariants.set_current(None)
            if memory_mb and limits.exhausted(outcome):
                over = limits.reason(int(memory_mb))
                print(over, file=sys.stderr)
                outcome, unhealthy = {**outcome, "verdict": "error", "reason": over}, over
        t_after = time.perf_counter()
        last = bool(task.get("last"))
        unhealthy = unhealthy or _health(kind, tidy=not last)
        if unhealthy:
            print(unhealthy, file=sys.stderr)
        if not last:
            _reset_between_cells()
        after_s = time.perf_counter() - t_after
        print(f"=== cell {t_after - t0:.2f} s, after it {after_s:.2f} s", file=sys.stderr)
    if unhealthy and outcome.get("reason") != unhealthy:
        outcome = {**outcome, "verdict": "error", "reason": unhealthy}
    return {
        "type": "result",
        "id": cell.id,
        "outcome": outcome,
        "duration_s": time.perf_counter() - t0,
        "healthy": not unhealthy,
    }


def _channel() -> IO[str]:
    """Keep the real stdout for the protocol; send everything printed to stderr instead."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    return proto


def _send(channel: IO[str], msg: Mapping[str, Any]) -> None:
    channel.write(json.dumps(msg, allow_nan=False) + "\n")
    channel.flush()


#: The protocol channel of this worker while it serves (:func:`serve_loop`); empty elsewhere.
_CHANNEL: list[IO[str]] = []


def notify_built(cell_id: str) -> None:
    """Tell the run that what ``cell_id`` builds for GPU cells is built, before the cell ends.

    A build cell builds the libraries GPU cells load, then goes on checking
    kernels: the pool holds those GPU cells back until this message rather
    than until the whole cell (:func:`validators.schedule.prerequisites`).
    Nothing happens outside a worker (a test, ``opgate perf``).
    """
    if _CHANNEL:
        _send(_CHANNEL[0], {"type": "built", "id": cell_id})


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="opgate.worker")
    ap.add_argument("--kind", choices=("cpu", "cuda", "build"), required=True)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--ops-path", action="append", default=[], type=Path)
    ap.add_argument(
        "--fork-server", type=int, metavar="FD", help="serve forks on this socket (see forkserver)"
    )
    ap.add_argument("--fork-server-listen", metavar="PATH", help="serve forks warm here (see warmserver)")
    ap.add_argument("--idle-s", type=float, default=1800.0, help="a warm server's idle exit")
    return ap.parse_args(argv)


def preload(
    ops_paths: Sequence[Path], kind: str = "cpu", *, for_forks: bool = False
) -> tuple[Mapping[str, Any], RunCell]:
    """Import what every cell of ``kind`` needs (torch, Triton, Dynamo, the checks) and load the specs.

    Touches no GPU: a fork server calls it once and forks workers from the
    result, and CUDA must not be initialised before a fork.  ``for_forks``
    (the fork server) also computes what each fork's first compile would
    (:func:`precompute_keys`); a worker of its own computes them only if it compiles.

    The cyclic garbage collector is off while it imports: the imports build
    ~620,000 objects and almost none are garbage, yet the collections they
    trigger walk them (on the CPU machine the preload took 4.6 s with it, 3.8 s
    without).  What was imported is then frozen (``gc.freeze``): no later
    collection in this process, or in the workers a fork server forks, walks
    those objects again or touches their pages.  Six small ``torch.compile``
    calls after the preload spent 0.29 s in the collector without the freeze
    and 0.01 s with it (0.96 s and 0.64 s in all).
    """
    import gc
    import importlib

    from opgate.validators import forkchild

    collecting = gc.isenabled()
    gc.disable()
    hashing: threading.Thread | None = None
    try:
        forkchild.record_import_env()
        importlib.import_module("torch")
        modules = PRELOAD.get(kind, PRELOAD_DEFAULT)
        for optional in modules:
            with contextlib.suppress(ImportError):
                importlib.import_module(optional)
            if optional == "triton" and for_forks:  # its keys are hashed while the rest imports
                hashing = threading.Thread(target=precompute_triton_keys, args=(kind,), daemon=True)
                hashing.start()
        if modules:
            from opgate.validators.checks.cell import MODE_CHECKS, checks_for

            for mode in MODE_CHECKS:
                with contextlib.suppress(ImportError):
                    checks_for(mode)

        if for_forks:
            if hashing is not None:
                hashing.join()  # no thread may be running when the server forks
            precompute_keys(kind, modules)

        from opgate.matrix.spec import load_specs
        from opgate.validators.checks import run_cell

        specs = load_specs(list(ops_paths))
    finally:
        if collecting:
            gc.enable()
    gc.freeze()
    return specs, run_cell


#: Architectures whose ptxas version Triton asks for (a subprocess) in a GPU process's first compile.
PTXAS_ARCHS = (80, 90)


def precompute_triton_keys(kind: str) -> None:
    """Triton's part of :func:`precompute_keys`: the ``libtriton.so`` hash, a GPU's ptxas version.

    Run on a thread of the fork server's preload while the main thread imports
    Dynamo and Inductor: reading and hashing 500 MB and waiting on ``ptxas``
    hold the GIL little.  The preload joins it before it returns, so no
    thread runs when the server forks.
    """
    with contextlib.suppress(Exception):
        from triton.runtime.cache import triton_key

        triton_key()
    if kind == "cuda":
        with contextlib.suppress(Exception):
            from triton.backends.nvidia.compiler import get_ptxas_version

            for arch in PTXAS_ARCHS:
                get_ptxas_version(arch)


def precompute_keys(kind: str, modules: Sequence[str]) -> None:
    """Compute once, before any fork, what every process pays for in its first compile.

    Triton keys its cache on a hash of all of ``libtriton.so`` (~500 MB read)
    and, for a GPU, runs ``ptxas --version``; Inductor hashes torch's own
    sources, and on the CPU probes the vector ISA by building and loading a
    test library (a compiler and a Python subprocess).  Each is cached for the
    life of a process, so a worker forked after they were computed inherits
    them.  A fresh worker (every isolated cell's) paid them inside its first
    cell: on the H200, 0.45 s of a cudagraphs cell's ``fake_meta`` check and
    0.3-0.7 s of its ``cudagraphs`` check; on the CPU machine 1.3 s of the
    first compile (``results/runs/h200-firstcell``).  Only file hashing and
    subprocesses: no CUDA, no allocator, no Triton launch, nothing a cell can
    see (a launch at start-up changed verdicts: see :func:`warm_cuda`; a whole
    warm-up ``torch.compile`` in the server took 41-52 s on the H200 host and
    left every forked cell unable to set up).  Never the ptxas version in the
    build server: a build cell's cross-compile runs its own CUDA toolkit's
    ptxas (``TRITON_PTXAS_PATH``), and Triton would keep the server's version.
    A failure is left for the cell, which then computes the value itself.
    Triton's part (:func:`precompute_triton_keys`) ran on a thread of
    :func:`preload` meanwhile, started as soon as Triton was imported.
    """
    if "torch._inductor.compile_fx" in modules:
        with contextlib.suppress(Exception):
            from torch._inductor import codecache

            codecache.torch_key()
            codecache.triton_key()
        if kind == "cpu":
            with contextlib.suppress(Exception):
                from torch._inductor.cpu_vec_isa import pick_vec_isa

                pick_vec_isa()


def arm() -> None:
    """Die with the parent; dump every thread's stack on a crash, or on SIGUSR1 (a hang)."""
    die_with_parent()
    faulthandler.enable(all_threads=True)
    faulthandler.register(signal.SIGUSR1, all_threads=True)


@dataclass(frozen=True)
class Preloaded:
    """What a worker needs from start-up: its kind, thread count, the op specs and the check runner."""

    kind: str
    threads: int
    specs: Mapping[str, Any]
    run_cell: RunCell


#: ``OPGATE_WARM_COMPARISONS=0``: a GPU worker leaves loading the comparison's kernels to its first cell.
WARM_COMPARISONS = "OPGATE_WARM_COMPARISONS"


def warm_cuda(torch: Any) -> None:
    """Create the CUDA context before saying hello, so no cell pays for it.

    A throw-away worker (an isolated cell's) is started while the lane's
    previous cell runs: made here, its context (~0.5 s on an H200) is ready
    when the cell arrives instead of inside the cell's set-up.  The
    correctness comparison's own kernels are loaded here too
    (:func:`warm_comparisons`).  Nothing of the op's: a 16-element Triton
    kernel launched at this point (to move Triton's first-launch cost, 0.5 s
    of a fresh worker's first check on the H200, out of the cell) changed
    verdicts there: six zero-size eager cells failed opcheck's output-alias
    comparison and 15 misaligned cudagraphs cells errored
    (``results/runs/h200-warmup-kernel``).  A cell must meet the Triton state
    of a fresh process.  A device that cannot start is left for the cell to
    report: the worker still says hello.
    """
    try:
        torch.ones(1, device="cuda").add_(1)
        torch.cuda.synchronize()
    except (RuntimeError, AssertionError) as exc:
        print(f"opgate: CUDA did not start before the first cell: {exc}", file=sys.stderr)
        return
    if not switched_off(os.environ, WARM_COMPARISONS):
        warm_comparisons(torch, "cuda")


def warm_comparisons(torch: Any, device: str) -> None:
    """Run the correctness comparison (:func:`validators.tolerance.compare`) once on a few numbers.

    CUDA loads a library's kernels when they are first launched.  The
    comparison launches some twenty aten kernels per output dtype (the float64
    casts, ``isfinite``, the masked maxima, ``frexp`` and ``ldexp`` of the ulp):
    in a worker's first cell on the H200 it took 0.18-0.24 s against 0.01 s in
    its second (``.ci/firstcell.py --per-child 2``, ``results/runs/h200-firstcell-2``),
    on every lane of every run.  These are opgate's kernels, not the op's, and
    only aten's: tiny tensors in the small pool the context already holds, all
    freed again.  Each dtype the matrix compares, with a NaN where the oracle is
    finite and an infinite oracle value, so every branch of the comparison runs.
    """
    from opgate.matrix.cell import DTYPES as MATRIX_DTYPES
    from opgate.ops.base import DTYPES
    from opgate.validators.tolerance import Rule, compare

    try:
        oracle = torch.tensor([0.5, -1.5, float("inf"), 3.0e-3, 0.0, 7.0, -2.0, 1.0], dtype=torch.float64)
        oracle = oracle.to(device)
        for dtype in (DTYPES[name] for name in MATRIX_DTYPES):
            out = oracle.to(dtype)
            out[1] = float("nan")
            compare(out, out.clone(), oracle, Rule(k=2.0, atol_floor=0.0))
        if device != "cpu":
            torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - never the worker's failure: the first cell loads them, as before
        print(f"opgate: the comparison kernels were not loaded before the first cell: {exc}", file=sys.stderr)


def start_standby(kind: str) -> bool:
    """What a standby worker makes before any run needs it (``forkloop``); False: the device is unusable.

    A GPU worker makes its CUDA context, which a worker forked for a run
    makes before its hello (~0.8 s each when a run's lanes start together on
    the H200), and nothing more: a warm-up compile, CUDA graph and profiler
    session on a throw-away function (``results/runs/h200-speed-standby``)
    left the first cells' costs where they were (their Triton compiles of the
    changed kernel, which no warm-up can make) and every later cell slower.
    A CPU worker has nothing to make.
    """
    if kind != "cuda":
        return True
    import torch

    warm_cuda(torch)
    unhealthy = _health(kind)
    if unhealthy:
        print(unhealthy, file=sys.stderr)
    return not unhealthy


def serve_loop(
    channel: IO[str], pre: Preloaded, t0: float, standby: Mapping[str, float] | None = None
) -> int:
    """Say hello (with this process's fingerprint), then run tasks from stdin until it closes.

    ``standby``: this worker was a standby (``forkloop``); its start-up and
    wait, which no run waited for, are in the hello, and ``startup_s`` counts
    from the moment a run took it.
    """
    import torch

    from opgate.validators.env import fingerprint

    if pre.threads > 0:
        torch.set_num_threads(pre.threads)
    if pre.kind == "cuda":
        if standby is None:  # a standby made its context and loaded the comparison's kernels already
            warm_cuda(torch)
        tritonvariants.install_recorder()  # the variants its cells compile, for the next run of their op
    hello = {
        "type": "hello",
        "pid": os.getpid(),
        "kind": pre.kind,
        "startup_s": round(time.perf_counter() - t0, 3),
        "fingerprint": fingerprint().to_json(),
    }
    if standby is not None:
        hello["standby"] = dict(standby)
    _send(channel, hello)
    _CHANNEL[:] = [channel]
    for line in sys.stdin:
        if not line.strip():
            continue
        task = json.loads(line)
        if task.get("type") == "precompile":  # a changed op's Triton variants, then exit (tritonvariants)
            return tritonvariants.run_jobs([Path(job) for job in task["jobs"]])
        reply = run_task(task, pre.specs, pre.run_cell, pre.kind)
        _send(channel, jsonable(reply))
        if not reply["healthy"]:
            return 3
    return 0


def serve(argv: Sequence[str] | None = None) -> int:
    """Worker entry point: start up once, then serve cells (or, with --fork-server, serve forks)."""
    args = _parse(argv)
    t0 = time.perf_counter()
    if args.kind == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        print("cpu worker started without TRITON_INTERPRET=1", file=sys.stderr)
        return 2
    if args.fork_server is not None or args.fork_server_listen:
        from opgate.validators.forkloop import serve_forks

        os.dup2(2, 1)  # the fork server talks over its socket; prints go to its log
        if args.fork_server_listen:  # a warm server outlives the run that started it
            faulthandler.enable(all_threads=True)
            return serve_forks(None, args.kind, args.threads, [], args.fork_server_listen, args.idle_s)
        arm()
        return serve_forks(args.fork_server, args.kind, args.threads, args.ops_path)
    channel = _channel()
    arm()
    specs, run_cell = preload(args.ops_path, args.kind)
    return serve_loop(channel, Preloaded(args.kind, args.threads, specs, run_cell), t0)


def exit_now(code: int) -> NoReturn:
    """Exit without tearing the interpreter down (torch's teardown costs ~1 s per worker).

    atexit handlers still run (Inductor's compile pools shut down cleanly); the
    per-cell results are already on the parent's side of the pipe.  Spawned and
    forked workers both end here.
    """
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
        atexit._run_exitfuncs()
    os._exit(code)


def main() -> None:
    exit_now(serve())


if __name__ == "__main__":
    main()
