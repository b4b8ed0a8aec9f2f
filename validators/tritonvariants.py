"""A changed op's Triton kernel variants, compiled ahead of its cells on the cores the lanes leave idle.

Why: after a change to one op's kernel, each of its cells compiles, at its
first launch, the kernel variants it needs (one per dtype, alignment and
constexpr set), on its own lane, one after the other.  On the H200, rope's 85
cells took 91.6 lane-s in a one-op run against 65.9 with the same kernels
already compiled; ``fake_meta``'s first launches alone took 14.2 lane-s more.
The variants are known before the run starts: the last run that ran the op
compiled them.

How:

* **Recording.**  A GPU worker sets Triton's ``jit_cache_hook`` (chained to a
  hook already set).  Triton calls it before it compiles a kernel variant in
  that process, with the variant's specialization data: Triton's own
  serialization, what ``JITFunction.preload`` reads.  The hook appends it,
  with the kernel's module and name, the device's target and the op of the
  cell that is running, to a file of the run (``RUN_VARIABLE``).  It never
  blocks a compile: it returns None, as Triton expects of a hook that lets it
  compile.
* **Storing.**  At the end of the run, each op's recorded variants are merged
  into a store beside the verdict cache (one folder per environment identity,
  one file per op implementation, one run at a time), each with the op's
  source digest it was compiled from.  A stored variant that none of this
  run's workers compiled, though a cell that had compiled it ran, is no
  longer needed (the kernel changed its specializations) and is dropped.
* **Precompiling.**  At the start of a run with GPUs, an op implementation with
  cells to run and stored variants compiled from other sources than its own
  now has changed (a run of a few of its cells leaves the others' variants
  marked with the old sources, so the next run still precompiles those):
  processes (one per idle core, at most one per :data:`PER_PROCESS` variants)
  import its kernels' modules and compile each stored variant with
  ``triton.compile`` for the stored target.  Idle cores only (one process
  where the lanes leave none): one process per core (16 for 39 variants on
  the H200, ``results/runs/h200-early-start``) slowed the lanes' first cells
  more than it hastened their variants.  The
  run starts one process, beside its cache lookup (``Runner._start_early``);
  it imports the kernels' modules and forks the others (:func:`run_jobs`): a
  start is a request to the build server the run waits for (11-24 ms each on
  the CPU machine), and one is made instead of eight (on the H200 that gap
  was 0.16 s with eight starts, 0.11-0.12 s with one).  It is the compile the cell's
  first launch would do, with the same cache key, into the same Triton
  cache: the cell finds the variant compiled, or waits for the compile under
  way (:mod:`validators.tritoncache`'s lock) instead of doing it again.
  Nothing waits for these processes: the run kills them when it ends, and a
  variant that no longer fits its kernel (a parameter renamed) fails alone,
  in their log.

What it is worth, on one H200 and the same host (``results/runs/h200-speed-warm-11``):
rope's 85 one-op cells took 77 lane-s with it and 84 without (one-op 11.3 s and 9.1 s,
against 11.8 s and 10.8 s).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeAlias

from opgate.matrix.files import exclusive
from opgate.validators.options import switched_off

#: The run's folder the workers record into (set by the runner for a run with GPUs).
RUN_VARIABLE = "OPGATE_TRITON_VARIANTS"
#: ``OPGATE_TRITON_PRECOMPILE=0``: record, but compile nothing ahead (the cells compile their own).
SWITCH = "OPGATE_TRITON_PRECOMPILE"
#: The most variants one op implementation keeps in the store (the newest first).
MAX_STORED = 512
#: A precompile process takes at least this many variants: below that, its imports cost
#: more than the compiles it would take from the lanes.
PER_PROCESS = 4
STORE_VERSION = 2
#: Op implementation ("rope.triton") -> its stored variants.
Variants: TypeAlias = Mapping[str, Sequence[Mapping[str, Any]]]
#: What identifies a recorded variant (besides ``cells``, the cells that compiled it, and
#: ``op_digest``, the op's sources it was compiled from).
VARIANT_KEYS = frozenset({"module", "name", "data", "target"})

_current: list[str] = []  # the running cell's op implementation ("rope.triton") and id, or empty
_recorded: set[tuple[str, str]] = set()  # (op implementation, line) this process appended already
_target: list[dict[str, Any]] = []  # the device target, asked once


def set_current(tag: str | None, cell: str = "") -> None:
    """The worker says which op implementation's cell runs now, and its id (None between cells)."""
    _current[:] = [tag, cell] if tag else []


def install_recorder(environ: Mapping[str, str] = os.environ) -> bool:
    """In a GPU worker: record each Triton variant this process compiles (see the module doc)."""
    folder = environ.get(RUN_VARIABLE)
    if not folder:
        return False
    try:
        from triton import knobs
    except ImportError:  # a Triton without knobs (< 3.4): nothing is recorded, nothing changes
        return False
    previous = knobs.runtime.jit_cache_hook

    def hook(**kwargs: Any) -> Any:
        with contextlib.suppress(Exception):  # recording must never break a compile
            _record(Path(folder), kwargs)
        return previous(**kwargs) if previous is not None else None

    knobs.runtime.jit_cache_hook = hook
    return True


def _record(folder: Path, kwargs: Mapping[str, Any]) -> None:
    if not _current:
        return
    fn, data = kwargs["fn"], kwargs["compile"]["specialization_data"]
    if "<locals>" in fn.name or fn.module == "__main__":
        return  # a fresh process could not find it by name
    if not _target:
        from triton.runtime import driver

        _target.append(dict(driver.active.get_current_target().__dict__))
    variant = {"module": fn.module, "name": fn.name, "data": data, "target": _target[0]}
    key = json.dumps(variant)
    if (_current[0], key) in _recorded:
        return
    _recorded.add((_current[0], key))
    line = json.dumps({**variant, "cells": [_current[1]]} if _current[1] else variant)
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / f"{_current[0]}.jsonl").open("a") as out:
        out.write(line + "\n")  # one write of one line: lanes appending side by side do not interleave


# -- the store --------------------------------------------------------------------------------
def _read_lines(path: Path) -> list[dict[str, Any]]:
    out = []
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                item = json.loads(line)
                if isinstance(item, dict) and item.keys() >= VARIANT_KEYS:
                    out.append(item)
    return out


#: The most cells a stored variant names (those that compiled it first in their worker).
MAX_CELLS = 16


def _identity(variant: Mapping[str, Any]) -> str:
    return json.dumps({k: variant[k] for k in sorted(VARIANT_KEYS) if k in variant}, sort_keys=True)


def _unique(items: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One entry per variant, first come first (its ``op_digest`` too), with the cells of all its entries."""
    seen: dict[str, dict[str, Any]] = {}
    for item in items:
        variant = {k: v for k, v in item.items() if k != "cells"}
        kept = seen.setdefault(_identity(variant), variant)
        cells = [c for c in item.get("cells") or () if isinstance(c, str)]
        if cells:
            kept["cells"] = list(dict.fromkeys([*kept.get("cells", []), *cells]))[:MAX_CELLS]
    return list(seen.values())


def needed_first(variants: Sequence[Mapping[str, Any]], order: Sequence[str]) -> list[Mapping[str, Any]]:
    """``variants`` in the order this run's cells (``order``: cell ids, as dispatched) will need them.

    A variant's place is that of the first of its recorded cells the run has;
    one of no cell of the run keeps its place after those.  Started in this
    order, each precompile process's first compile is one a lane's first cell
    waits for, not one a cell near the end would.
    """
    place = {cell: i for i, cell in reversed(list(enumerate(order)))}
    last = len(order)

    def rank(variant: Mapping[str, Any]) -> int:
        return min((place.get(c, last) for c in variant.get("cells") or ()), default=last)

    return sorted(variants, key=rank)


def gpu_ops(
    tasks: Iterable[Any], specs: Mapping[str, Any], op_digest: Callable[[Any], str]
) -> dict[str, str]:
    """The op implementations of a run's GPU cells (``op.impl``) -> their sources' digest now."""
    ops = {(t.cell.op, t.cell.impl) for t in tasks if t.kind == "cuda" and t.cell.op in specs}
    return {f"{op}.{impl}": op_digest(specs[op]) for op, impl in sorted(ops)}


@dataclass
class Store:
    """The variants each op implementation compiled the last times it ran, in one environment."""

    folder: Path

    @classmethod
    def beside(cls, cache: Any) -> Store:
        """The store of a verdict cache's environment (``<root>/triton-variants/<environment>``)."""
        return cls(cache.root / "triton-variants" / cache.environment_digest)

    def changed(self, digests: Mapping[str, str]) -> dict[str, list[dict[str, Any]]]:
        """Per op implementation, its stored variants compiled from other sources than ``digests`` says."""
        out = {}
        for tag, digest in digests.items():
            _, variants = self.read(tag)
            stale = [v for v in variants if v.get("op_digest") != digest]
            if stale:
                out[tag] = stale
        return out

    def read(self, tag: str) -> tuple[str, list[dict[str, Any]]]:
        """The op's source digest when last stored, and its variants (``("", [])`` when none)."""
        try:
            doc = json.loads((self.folder / f"{tag}.json").read_text())
        except (OSError, ValueError):
            return "", []
        if not isinstance(doc, dict) or doc.get("version") != STORE_VERSION:
            return "", []
        digest = str(doc.get("op_digest", ""))
        entries = doc.get("variants", [])
        variants = _unique(v for v in entries if isinstance(v, dict) and v.keys() >= VARIANT_KEYS)
        for variant in variants:
            variant.setdefault("op_digest", digest)
        return digest, variants

    def merge(self, run_folder: Path, digests: Mapping[str, str], ran: Iterable[str] = ()) -> dict[str, int]:
        """Merge a finished run's recordings (newest first, at most :data:`MAX_STORED`); counts per op.

        ``ran``: the ids of the cells this run ran.  A stored variant recorded
        by one of them that this run did not record is no longer compiled by
        any cell: it is dropped.  One run merges at a time (a lock file beside
        the store): two runs sharing a cache keep each other's variants.
        """
        cells_ran = set(ran)
        counts = {}
        with exclusive(self.folder / ".lock"):
            for path in sorted(run_folder.glob("*.jsonl")):
                tag = path.stem
                if tag not in digests:
                    continue
                new = [{**v, "op_digest": digests[tag]} for v in _unique(_read_lines(path))]
                recorded = {_identity(v) for v in new}
                _, old = self.read(tag)
                kept = [
                    v
                    for v in old
                    if _identity(v) in recorded or not cells_ran.intersection(v.get("cells") or ())
                ]
                variants = _unique([*new, *kept])[:MAX_STORED]
                doc = {"version": STORE_VERSION, "op_digest": digests[tag], "variants": variants}
                tmp = self.folder / f"{tag}.json.{os.getpid()}.tmp"
                tmp.write_text(json.dumps(doc))
                tmp.replace(self.folder / f"{tag}.json")
                counts[tag] = len(new)
        return counts


# -- precompiling ----------------------------------------------------------------------------
class Handle(Protocol):
    """A process compiling one job: what the run asks of it."""

    def poll(self) -> int | None: ...

    def kill(self) -> object: ...


#: Start a process compiling the job files it is given (:func:`run_jobs` in that process).
Launch = Callable[[Sequence[Path]], Handle]


class _Session:
    """A fresh interpreter in its own session (killed as a group: ptxas with it)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc

    def poll(self) -> int | None:
        return self.proc.poll()

    def kill(self) -> object:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        return self.proc.wait()


def fresh_interpreter(env: Mapping[str, str], python: str = sys.executable) -> Launch:
    """The jobs in a new ``python -m opgate.validators.tritonvariants JOB...`` (pays torch's import once)."""

    def launch(jobs: Sequence[Path]) -> Handle:
        argv = [python, "-m", "opgate.validators.tritonvariants", *map(str, jobs)]
        with jobs[0].with_suffix(".log").open("w") as log:
            proc = subprocess.Popen(
                argv, env=dict(env), stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
            )
        return _Session(proc)

    return launch


@dataclass
class Precompile:
    """The precompile processes of one run: started by :func:`start`, ended by :meth:`stop`."""

    ops: dict[str, int]  # op implementation -> variants to compile
    jobs: list[Path] = field(default_factory=list)  # one per process
    shares: list[int] = field(default_factory=list)  # variants given to each process
    proc: Handle | None = None  # the first process (it forked the others: one process group)
    t0: float = field(default_factory=time.time)

    def stop(self) -> dict[str, Any]:
        """Kill those still compiling (the run no longer needs them); what each compiled, and when."""
        if self.proc is not None:  # its group, the forks too: also when the first process ended
            self.proc.kill()  # before them (a crash), which leaves its forks compiling
        totals: dict[str, Any] = {"compiled": 0, "failed": 0, "unfinished": 0}
        ready, done_at = [], []
        for job, share in zip(self.jobs, self.shares, strict=True):
            last = _last_json(job.with_suffix(".out"))  # its running totals, one line per variant
            totals["compiled"] += int(last.get("compiled", 0))
            totals["failed"] += int(last.get("failed", 0))
            totals["unfinished"] += share - int(last.get("compiled", 0)) - int(last.get("failed", 0))
            if "ready_at" in last:
                ready.append(float(last["ready_at"]) - self.t0)
                done_at.append(float(last["at"]) - self.t0)
        summary = {"ops": self.ops, "processes": len(self.jobs), **totals}
        if ready:  # seconds from the start: the imports done, the last variant compiled
            summary.update(ready_s=round(max(ready), 2), last_compiled_s=round(max(done_at), 2))
        return summary


def _last_json(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError:
        return {}
    for line in reversed(text.splitlines()):
        with contextlib.suppress(ValueError):
            doc = json.loads(line)
            if isinstance(doc, dict) and "compiled" in doc:
                return doc
    return {}


def start(
    work: Path,
    variants: Variants,
    *,
    cores: int,
    launch: Launch,
    sys_path: Sequence[str],
    order: Sequence[str] = (),
    environ: Mapping[str, str] = os.environ,
) -> Precompile | None:
    """Start processes compiling ``variants`` (op implementation -> variants), or None if none.

    ``order``: the run's cell ids as the lanes will take them (:func:`needed_first`); the
    variants are dealt out in that order, one to each process in turn.
    """
    if switched_off(environ, SWITCH):
        return None
    todo = needed_first([v for tag in sorted(variants) for v in variants[tag]], order)
    n = min(max(cores, 1), -(-len(todo) // PER_PROCESS))
    if not todo or n < 1:
        return None
    work.mkdir(parents=True, exist_ok=True)
    run = Precompile({tag: len(v) for tag, v in variants.items() if v})
    for i in range(n):
        job, share = work / f"precompile-{i}.json", todo[i::n]
        job.write_text(json.dumps({"sys_path": list(sys_path), "variants": share}))
        run.jobs.append(job)
        run.shares.append(len(share))
    run.proc = launch(run.jobs)
    return run


def _kernel(module: str, name: str) -> Any:
    """The ``JITFunction`` ``module.name`` (through an autotuner's or heuristics' ``fn``)."""
    from triton.runtime.jit import JITFunction

    obj: Any = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    while not isinstance(obj, JITFunction) and hasattr(obj, "fn"):
        obj = obj.fn
    if not isinstance(obj, JITFunction):
        raise TypeError(f"{module}.{name} is not a Triton kernel")
    return obj


def _decode_constant(value: Any) -> Any:
    """A constexpr as ``serialize_specialization_data`` wrote it, as Triton's ``preload`` reads it."""
    import triton.language as tl
    from triton.runtime.jit import convert_to_tuple_if_list

    if isinstance(value, str) and tl.dtype.is_dtype(value):
        return tl.dtype(value)
    if isinstance(value, dict) and "constexpr" in value:
        return tl.constexpr(convert_to_tuple_if_list(value["constexpr"]))
    if isinstance(value, dict) and "jit_function" in value:
        module, _, name = value["jit_function"].partition(":")
        return _kernel(module, name)
    return convert_to_tuple_if_list(value)


def compile_variant(variant: Mapping[str, Any]) -> None:
    """Compile one recorded variant as the launch that recorded it did (same source, key and cache)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile, make_backend  # noqa: A004 - Triton's name
    from triton.runtime.jit import convert_to_tuple_if_list

    fn = _kernel(variant["module"], variant["name"])
    data = json.loads(variant["data"])
    target = GPUTarget(**variant["target"])
    backend = make_backend(target)
    pairs = zip(data["constant_keys"], data["constant_vals"], strict=True)
    constexprs = {tuple(k): _decode_constant(v) for k, v in pairs}
    attrs = dict(zip(map(tuple, data["attrs_keys"]), data["attrs_vals"], strict=True))
    signature = {k: convert_to_tuple_if_list(v) for k, v in data["signature"].items()}
    options = {k: tuple(v) if isinstance(v, list) else v for k, v in data["options"].items()}
    src = ASTSource(fn, signature, constexprs, attrs)
    compile(src, target=target, options=backend.parse_options(options).__dict__)


def _import_kernels(job: Mapping[str, Any]) -> None:
    sys.path[:0] = [p for p in job["sys_path"] if p not in sys.path]
    for module in sorted({v["module"] for v in job["variants"]}):
        with contextlib.suppress(Exception):  # a module that fails to import fails its variants below
            importlib.import_module(module)


def run_jobs(paths: Sequence[Path]) -> int:
    """Each job in a process of its own: this one takes the first and forks one per other job.

    The kernels' modules are imported before the forks, once.  The forks share
    this process's group (a kill of it takes them), and it returns once they
    all ended: a precompile is running as long as this process is.  The
    process is a build server's fork or a fresh interpreter, and neither has
    started a thread or CUDA: a fork is safe.
    """
    from opgate.validators.worker import die_with_parent  # here: worker imports this module

    jobs = [json.loads(path.read_text()) for path in paths]
    for job in jobs:
        _import_kernels(job)
    children = []
    sys.stdout.flush()
    sys.stderr.flush()  # nothing buffered before the forks is written twice
    for path, job in zip(paths[1:], jobs[1:], strict=True):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the fork's own exit, measured through its .out file
            code = 1
            try:
                die_with_parent()  # not inherited across a fork: the first process's death ends it
                code = _compile_job(path, job)
            finally:
                os._exit(code)
        children.append(pid)
    code = _compile_job(paths[0], jobs[0])
    for pid in children:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    return code


def _compile_job(job_path: Path, job: Mapping[str, Any]) -> int:
    """Compile a job's variants; its running totals go to ``JOB.out``, one line per variant."""
    compiled = failed = 0
    ready_at = time.time()  # the kernels' modules imported: compiling starts
    with job_path.with_suffix(".out").open("w") as out:
        for variant in job["variants"]:
            t = time.monotonic()
            try:
                compile_variant(variant)
            except Exception as exc:  # noqa: BLE001 - one stale variant must not stop the others
                failed += 1
                print(f"{variant['module']}.{variant['name']}: {type(exc).__name__}: {exc}", file=sys.stderr)
            else:
                compiled += 1
                print(f"{variant['module']}.{variant['name']}: {time.monotonic() - t:.2f} s", file=sys.stderr)
            line = {"compiled": compiled, "failed": failed, "of": len(job["variants"])}
            out.write(json.dumps({**line, "ready_at": ready_at, "at": time.time()}) + "\n")
            out.flush()  # a process killed at the run's end has said what it did
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m opgate.validators.tritonvariants JOB...``: the jobs, from a fresh interpreter.

    It dies with the run that started it (a build server's worker already does).
    """
    from opgate.validators.worker import die_with_parent

    die_with_parent()
    return run_jobs([Path(a) for a in (argv if argv is not None else sys.argv[1:])])


if __name__ == "__main__":
    sys.exit(main())
