"""A run's share of the Triton precompile: what it starts, how, and what it keeps afterwards.

Why a module of its own: :mod:`validators.tritonvariants` knows variants (recording,
the store, compiling them in processes); :class:`validators.runner.Runner`
orchestrates a run.  In between sits what one run does with them, from two
places: the early start beside the cache lookup (:mod:`validators.earlystart`)
and the pool's start, which precompiles the changed ops the early start did
not (an op whose first GPU cell had a stored verdict, say, whose other cells
still run).  At the end the run stops what still compiles, says in
``run.json`` what was compiled (``triton_precompile``) and stores what its GPU
workers recorded.  Nothing here is a reason for a run to fail.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opgate.validators import tritonvariants

if TYPE_CHECKING:
    from opgate.validators.device import Gpu
    from opgate.validators.workerproc import Launcher, WorkerProcess


class Compiling:
    """A build worker given a precompile job (:meth:`RunPrecompile.launch`)."""

    def __init__(self, worker: WorkerProcess) -> None:
        self.worker = worker

    def poll(self) -> int | None:
        if self.worker.alive:
            return None
        rc = self.worker.proc.poll()
        return -signal.SIGKILL if rc is None else rc  # None: orphaned, its server killed it

    def kill(self) -> object:
        rc = self.worker.kill()
        self.worker.release()
        return rc


#: Summed over a run's precompiles (``run.json``'s ``triton_precompile``); the times: the latest.
_SUMMED = ("processes", "compiled", "failed", "unfinished")
_LATEST = ("ready_s", "last_compiled_s")


class RunPrecompile:
    """The precompiles one run started, and the folders it records and compiles in (under ``out/work``)."""

    def __init__(self, out: Path, python: str) -> None:
        self.recordings = out / "work" / "triton-variants"  # what the run's GPU workers compiled
        self.jobs = out / "work" / "precompile"  # the precompile's job files and progress
        self.python = python
        self.started: list[tritonvariants.Precompile] = []
        self.ops: set[str] = set()  # op implementations started ("rope.triton")
        self.summary: dict[str, Any] = {}  # what run.json says
        self._stopped = False

    def clear(self) -> None:
        """The last run's recordings and jobs (merged once, read never) go before this run writes its own."""
        for folder in (self.recordings, self.jobs):
            shutil.rmtree(folder, ignore_errors=True)

    def start(
        self,
        variants: tritonvariants.Variants,
        *,
        launcher: Launcher,
        gpu: Gpu,
        sys_path: Sequence[str],
        lanes: int,
        order: Sequence[str],
    ) -> None:
        """Compile ``variants`` of the ops not started yet, on the cores ``lanes`` leave idle."""
        todo = {tag: v for tag, v in variants.items() if tag not in self.ops and v}
        if not todo or self._stopped:
            return
        self.ops.update(todo)
        try:
            run = tritonvariants.start(
                self.jobs / str(len(self.started)),  # the early start's, then the pool's start's
                todo,
                cores=len(os.sched_getaffinity(0)) - lanes,
                launch=self.launch(launcher, gpu),
                sys_path=sys_path,
                order=order,
            )
        except Exception as exc:  # noqa: BLE001 - a speed-up that did not start: the cells compile their own
            self.summary["error"] = f"not started: {type(exc).__name__}: {exc}"
            return
        if run is not None:
            self.started.append(run)

    def launch(self, launcher: Launcher, gpu: Gpu) -> tritonvariants.Launch:
        """Forks of the build server when it is ready (a warm one: torch and Triton imported), else
        fresh interpreters: a fork now beats waiting for its imports, the cells would not wait."""
        if not (launcher.forks("build") and launcher.startable("build")):
            return tritonvariants.fresh_interpreter(launcher.config.env("cuda", gpu), self.python)

        def fork(jobs: Sequence[Path]) -> tritonvariants.Handle:
            worker = launcher.spawn("precompile", "build", None, fresh=True)
            compiling = Compiling(worker)
            try:
                worker.send({"type": "precompile", "jobs": [str(job) for job in jobs]})
            except BaseException:
                compiling.kill()  # a worker that took no job is not left behind
                raise
            return compiling

        return fork

    def stop(self) -> None:
        """End what still compiles (the run no longer needs it); what each compiled goes to the summary."""
        if self._stopped:
            return
        self._stopped = True
        for run in self.started:
            with contextlib.suppress(OSError):
                part = run.stop()
                self.summary["ops"] = {**self.summary.get("ops", {}), **part.get("ops", {})}
                for key in _SUMMED:
                    self.summary[key] = self.summary.get(key, 0) + int(part.get(key, 0))
                for key in _LATEST:
                    if key in part:
                        self.summary[key] = max(float(self.summary.get(key, 0.0)), float(part[key]))

    def store(self, cache: Any, digests: Mapping[str, str], ran: Iterable[str]) -> None:
        """Keep what the run's GPU workers compiled for their op's next change (a read-only cache: not)."""
        if not self.recordings.is_dir():
            return
        with contextlib.suppress(OSError):
            store = tritonvariants.Store.beside(cache)
            self.summary["recorded"] = store.merge(self.recordings, digests, ran)
