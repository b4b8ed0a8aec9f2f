"""The worker pool: lanes of worker processes fed cells, watched for crashes and hangs.

A *lane* runs one cell at a time: ``--jobs`` host lanes (cpu and build cells)
and ``--gpu-workers`` lanes per visible GPU (cuda cells of that GPU's arch).
With several workers per GPU, the host lanes also take cuda cells once no
host cell waits (:class:`validators.lanes.Lane`): builds are few and early,
and a build lane idle for the rest of the run is capacity nobody uses; and
the GPU lanes take build cells while the cuda server still imports.  A
lane keeps a reusable worker (torch imported once for many cells) and, for
cells that must be isolated (AOTI, CUDA graphs, re-runs), a throw-away worker
that is started while the previous cell still runs (a *spare*).  Workers are
forked from a per-kind fork server (:mod:`validators.forkserver`) when the run
allows, so a fresh worker costs milliseconds, not a torch import.  One
thread, one ``select`` loop: no locks, and every deadline is checked in one
place.

A worker that dies charges only the cell it was running: the attempt becomes
``error`` naming the signal ("worker killed by SIGSEGV"; a SIGKILL from outside,
e.g. the OOM killer, is marked ``external`` so a passing re-run cannot turn it
into ``flaky``) and the lane starts a fresh worker.  A cell past its timeout gets a stack dump (SIGUSR1 ->
faulthandler, into the cell's log), then its worker's process group is killed.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import selectors
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from opgate.validators.device import Gpu
from opgate.validators.lanes import Attempt, Lane, Task, gpu_lanes, usable
from opgate.validators.workerproc import (
    Launcher,
    WorkerConfig,
    WorkerProcess,
    exit_description,
    killed_from_outside,
    worker_name,
)

__all__ = ["Attempt", "Pool", "Task"]

STARTUP_TIMEOUT_S = 300.0
#: How long idle workers get, all together, to exit on EOF before their groups are killed
#: (every result is already in; their exit only tidies Inductor's compile pools).
SHUTDOWN_GRACE_S = 0.5
#: Consecutive start-up failures after which a worker kind is given up (its cells -> error).
MAX_STARTUP_FAILURES = 2
STACK_DUMP_GRACE_S = 0.5


Done = Callable[[Task, Attempt], Iterable[Task]]


class Pool:
    """Runs tasks on lanes; ``on_done`` gets each attempt and may return follow-up tasks."""

    def __init__(
        self,
        config: WorkerConfig,
        host_lanes: int,
        gpus: Sequence[Gpu] = (),
        *,
        keep_spare: bool = False,
        gpu_workers: int = 1,
        launcher: Launcher | None = None,
    ) -> None:
        self.config = config
        self.keep_spare = keep_spare  # re-runs are likely: keep a fresh worker warm on every busy lane
        self.t0 = time.monotonic()
        self.shutdown_s = 0.0
        lend = lends_gpus(gpus, gpu_workers)
        self.lanes = [
            Lane(f"cpu{i}", gpu=gpus[i % len(gpus)] if lend else None, host=True)
            for i in range(max(1, host_lanes))
        ]
        self.lanes += [Lane(name, gpu=g, lends=lend) for name, g in gpu_lanes(gpus, gpu_workers)]
        self.workers: list[WorkerProcess] = []
        self.launcher = launcher or Launcher(config)  # the runner's: its servers may be importing already
        self.fingerprint: dict[str, Any] = {}
        self._sel = selectors.DefaultSelector()
        for lane in self.lanes:  # workers the runner started while it planned (Launcher.prefork)
            early = self.launcher.adopt(lane.name)
            if early is not None:
                lane.reusable = early
                self.workers.append(early)
                self._sel.register(early.fd, selectors.EVENT_READ, early)
        self._failures: collections.Counter[str] = collections.Counter()
        self._failure_text: dict[str, str] = {}
        self._pending: collections.deque[Task] = collections.deque()
        self._on_done: Done = lambda task, attempt: ()
        self._after: dict[str, frozenset[str]] = {}
        self._built: set[str] = set()  # build cells that said their libraries are built (worker)

    def run(
        self,
        tasks: Iterable[Task],
        on_done: Done,
        background: Iterator[list[Task]] | None = None,
        after: Mapping[str, frozenset[str]] | None = None,
    ) -> None:
        """Run ``tasks`` and what ``on_done`` adds; ``background``: the runner's own work between polls.

        Each step of ``background`` is a few milliseconds of the runner's work
        (serving cached verdicts while the lanes already run the changed
        cells) and may add tasks; the pool looks at its workers between steps
        and does not wait in its poll while steps are left.  ``after``: cell id
        -> the cells whose builds it loads (:func:`validators.schedule.prerequisites`);
        no lane starts it while one of those is still to run or running (it
        would sit on the build's lock, where the lane cannot take a cell whose
        build has landed meanwhile).
        """
        self._pending, self._on_done = collections.deque(tasks), on_done
        self._after = dict(after or {})
        try:
            self.launcher.prestart(sorted({t.kind for t in self._pending}))
            while self._pending or self._busy() or background is not None:
                if background is not None:
                    try:
                        more = next(background)
                    except StopIteration:
                        background = None
                    else:
                        self._pending.extend(more)
                        self.launcher.prestart(sorted({t.kind for t in more}))
                # looked at before the dispatch: a server ready then is ready for the dispatch too,
                # while one that gets ready during it must not make its cells look unplaceable
                importing = self.launcher.importing()
                self._dispatch()
                if self._pending and not self._busy() and not importing:
                    for task in list(self._pending):  # planning placed a cell no lane serves
                        self._pending.remove(task)
                        self._finish(task, Attempt(_error(f"no lane runs {task.kind} cells"), 0.0))
                    continue
                self._prewarm()
                if background is None:  # a lane idle now may get a cell from the background's next step
                    self._retire_idle()
                self._poll(busy=background is not None)
                self._check_deadlines()
        except BaseException:  # interrupted (Ctrl-C, SIGTERM): no politeness, no orphans
            self.shutdown(force=True)
            raise
        self.shutdown()

    def _busy(self) -> bool:
        return any(lane.task is not None for lane in self.lanes)

    # -- assigning ---------------------------------------------------------------------------
    def _dispatch(self) -> None:
        ready = functools.cache(self.launcher.startable)  # one look per server kind, not per task
        building = self._building()
        for lane in self.lanes:
            startable = functools.partial(self._startable, lane, ready, building)
            while lane.task is None:
                task = lane.pick(self._pending, startable)
                if task is None:
                    break
                self._pending.remove(task)
                if self._failures[task.kind] >= MAX_STARTUP_FAILURES:
                    reason = f"{task.kind} worker failed to start: {self._failure_text.get(task.kind, '?')}"
                    self._finish(task, Attempt(_error(reason), 0.0, retryable=False))
                    continue
                self._start(lane, task)

    def _building(self) -> set[str]:
        """Cells some ``after`` entry waits for that are still to run or running (empty without any)."""
        if not self._after:
            return set()
        tasks = [*self._pending, *(lane.task for lane in self.lanes if lane.task is not None)]
        return {t.cell.id for t in tasks if t.kind != "cuda" and t.cell.id not in self._built}

    def _startable(self, lane: Lane, ready: Callable[[str], bool], building: set[str], task: Task) -> bool:
        """The lane has a worker for it, or one starts now (``ready``: its server is not importing),
        and no build it loads is still to come (``after``)."""
        need = self._after.get(task.cell.id)
        if need is not None and not need.isdisjoint(building):
            return False
        have = lane.spare if task.fresh else lane.reusable
        return usable(have, task.kind) or ready(task.kind)

    def _start(self, lane: Lane, task: Task) -> None:
        worker: WorkerProcess
        if task.fresh:
            if lane.spare is not None and usable(lane.spare, task.kind):
                worker, lane.spare = lane.spare, None
            else:
                worker = self._spawn(task.kind, lane, fresh=True)
        else:
            if lane.reusable is not None and not usable(lane.reusable, task.kind):
                self._retire(lane.reusable, "replaced by another kind")
                lane.reusable = None
            if lane.reusable is None:
                lane.reusable = self._spawn(task.kind, lane)
            worker = lane.reusable
        lane.current, lane.task, lane.sent_at = worker, task, 0.0
        if worker.ready:
            self._send(lane)
        else:
            lane.deadline = worker.started + STARTUP_TIMEOUT_S

    def _prewarm(self) -> None:
        """Start the worker each busy lane will need next, while its current cell runs.

        A spare (throw-away worker) for the next isolated cell or, with
        ``keep_spare``, for a re-run of the current cell if it fails (only for
        workers that are not forked: a fork costs milliseconds, a spare would
        cost a worker per lane, on a GPU a CUDA context each); a new reusable
        worker when the last one died or is of the wrong kind.
        """
        for lane in self.lanes:
            if lane.task is None or self._failures[lane.task.kind]:
                continue
            if lane.current is not None and not lane.current.ready:
                # Not while the lane's own worker starts: CUDA contexts made together slow each other
                # (on the H200, 16 at once took 2.1-2.3 s each, one alone 0.3 s), so a spare started
                # beside the first workers delays every lane's first cell.  Once the lane's worker is
                # up its cell runs for seconds: time enough for the next worker.
                continue
            nxt = lane.pick(self._pending)
            spare_kind = nxt.kind if nxt is not None and nxt.fresh else None
            if (
                spare_kind is None
                and self.keep_spare
                and lane.current is not None
                and not self.launcher.forks(lane.task.kind)  # a fork is ready in ms when a re-run needs it
            ):
                spare_kind = lane.task.kind
            if (
                spare_kind is not None
                and not self._failures[spare_kind]
                and not usable(lane.spare, spare_kind)
                and self.launcher.startable(spare_kind)  # a fork now, never a wait on imports
            ):
                if lane.spare is not None:
                    self._retire(lane.spare, "spare of another kind")
                lane.spare = self._spawn(spare_kind, lane, fresh=True)
            if nxt is None or nxt.fresh or self._failures[nxt.kind] or not self.launcher.startable(nxt.kind):
                continue
            if lane.current is not lane.reusable and not usable(lane.reusable, nxt.kind):
                if lane.reusable is not None:
                    self._retire(lane.reusable, "replaced by another kind")
                lane.reusable = self._spawn(nxt.kind, lane)

    def _retire_idle(self) -> None:
        """Stop the workers of lanes with nothing left to run, while the other lanes finish.

        Their exit then overlaps the last cells instead of adding to the
        shutdown; a re-run that comes later gets a fresh worker (a fork).
        """
        for lane in self.lanes:
            if lane.task is not None or (lane.reusable is None and lane.spare is None):
                continue
            if any(lane.can_run(t) for t in self._pending):
                continue
            for worker in (lane.reusable, lane.spare):
                if worker is not None:
                    self._retire(worker, "lane idle: nothing left to run")
            lane.reusable = lane.spare = None

    def _send(self, lane: Lane) -> None:
        task, worker = lane.task, lane.current
        if task is None or worker is None:
            return
        worker.cells.append(task.cell.id)
        lane.sent_at = time.monotonic()
        lane.deadline = lane.sent_at + task.timeout_s
        msg = {
            "cell": task.cell.to_json(),
            "seed": task.seed,
            "attempt": task.attempt,
            "log": str(task.log),
            "workdir": str(task.workdir),
            "timeout_s": task.timeout_s,
            "memory_mb": task.memory_mb,
            "last": worker is not lane.reusable,  # a throw-away worker: nothing to tidy for a next cell
        }
        with contextlib.suppress(OSError):  # the worker died: its EOF arrives through the selector
            worker.send(msg)

    def _spawn(self, kind: str, lane: Lane, *, fresh: bool = False) -> WorkerProcess:
        """A worker for ``lane``: its reusable one, or (``fresh``) a throw-away one for isolated cells."""
        gpu = lane.gpu if kind == "cuda" else None
        name = worker_name(kind, lane.name, len(self.workers) + 1)
        worker = self.launcher.spawn(name, kind, gpu, fresh=fresh)
        self.workers.append(worker)
        self._sel.register(worker.fd, selectors.EVENT_READ, worker)
        return worker

    # -- events ------------------------------------------------------------------------------
    def _poll(self, *, busy: bool = False) -> None:
        """Read what the workers sent; wait for it up to the next deadline (not at all when ``busy``)."""
        deadlines = [lane.deadline for lane in self.lanes if lane.task is not None]
        wait = min(deadlines, default=time.monotonic() + 1.0) - time.monotonic()
        # cells waiting on a server's imports: look again soon (its ready message is not on the selector)
        cap = 0.05 if self._pending and self.launcher.importing() else 1.0
        if busy:
            cap = 0.0
        for key, _ in self._sel.select(timeout=min(max(0.0, wait), cap)):
            worker: WorkerProcess = key.data
            for msg in worker.read():
                self._on_message(worker, msg)
            if worker.eof:
                self._on_death(worker)

    def _lane_running(self, worker: WorkerProcess) -> Lane | None:
        return next((lane for lane in self.lanes if lane.current is worker and lane.task), None)

    def _on_message(self, worker: WorkerProcess, msg: dict[str, Any]) -> None:
        lane = self._lane_running(worker)
        if msg.get("type") == "hello":
            worker.hello(msg)
            if not self.fingerprint or (worker.kind == "cuda" and not self.fingerprint.get("gpus")):
                self.fingerprint = worker.fingerprint  # a GPU worker's, when there is one: it sees the GPUs
            self._failures[worker.kind] = 0
            if lane is not None and not lane.sent_at:
                self._send(lane)
        elif msg.get("type") == "built" and lane is not None and lane.task is not None:
            self._built.add(lane.task.cell.id)  # what GPU cells wait for is built; the cell goes on
        elif msg.get("type") == "result" and lane is not None and lane.task is not None:
            task = lane.task
            outcome = msg.get("outcome")
            if not isinstance(outcome, dict):
                outcome = _error("worker sent a result without an outcome")
            attempt = Attempt(outcome, float(msg.get("duration_s") or 0.0), worker.name)
            lane.current, lane.task = None, None
            if worker is not lane.reusable:
                self._retire(worker, "isolated cell done")
            elif not msg.get("healthy", True):
                self._retire(worker, "unhealthy after cell")
                lane.reusable = None
            self._finish(task, attempt)

    def _forget(self, worker: WorkerProcess) -> None:
        self._unregister(worker)
        for lane in self.lanes:
            if lane.reusable is worker:
                lane.reusable = None
            if lane.spare is worker:
                lane.spare = None

    def _on_death(self, worker: WorkerProcess) -> None:
        lane = self._lane_running(worker)
        self._forget(worker)
        rc = worker.wait()
        worker.release()  # its pipes now, not at the run's end: isolated cells start a worker each
        worker.end = worker.end or exit_description(rc)
        if not worker.ready and not worker.retiring:
            self._startup_failed(worker)
        if lane is None or lane.task is None:
            return
        task = lane.task
        lane.current, lane.task = None, None
        if not worker.ready:
            self._pending.appendleft(task)  # not this cell's fault; _dispatch gives up after repeats
            return
        reason = exit_description(rc)
        said = _cell_output_tail(task.log) if rc is not None and rc > 0 else ""
        _append(task.log, f"=== {reason}")
        if said:  # a library that calls exit() says why only on stderr (bitsandbytes: "Error ... ops.cu")
            reason = f"{reason}; last output: {said}"
        elapsed = time.monotonic() - lane.sent_at
        attempt = Attempt(_error(reason), elapsed, worker.name, external=killed_from_outside(rc))
        self._finish(task, attempt)

    def _startup_failed(self, worker: WorkerProcess) -> None:
        self._failures[worker.kind] += 1
        self._failure_text[worker.kind] = f"{worker.end}; {_last_line(worker.log)}"

    def _check_deadlines(self) -> None:
        """End the cells past their deadline: their stacks dumped, their workers killed, all together.

        Every expired lane is handled in one pass (one grace period for the
        stack dumps, every group killed before any is waited for): lanes that
        hung on one shared cause (a wedged GPU) no longer cost a grace period
        and a wait each while the other lanes' results go unread.
        """
        now = time.monotonic()
        expired = []
        for lane in self.lanes:
            worker, task = lane.current, lane.task
            if task is None or worker is None or now < lane.deadline:
                continue
            lane.current, lane.task = None, None
            expired.append((lane, worker, task))
        if not expired:
            return
        hung = [worker for _, worker, _ in expired if worker.ready]
        for worker in hung:
            worker.dump_stacks()
        if hung:
            time.sleep(STACK_DUMP_GRACE_S)
        for _, worker, _ in expired:
            self._forget(worker)
            worker.kill_group()
        for lane, worker, task in expired:
            worker.wait()
            worker.release()
            if not worker.ready:
                worker.end = f"no hello within {STARTUP_TIMEOUT_S:.0f} s"
                self._startup_failed(worker)
                self._pending.appendleft(task)
                continue
            worker.end = reason = f"timeout after {task.timeout_s:g} s (worker killed)"
            _append(task.log, f"=== {reason}")
            self._finish(task, Attempt(_error(reason), now - lane.sent_at, worker.name, timed_out=True))

    def _finish(self, task: Task, attempt: Attempt) -> None:
        for follow_up in reversed(list(self._on_done(task, attempt))):
            self._pending.appendleft(follow_up)

    # -- stopping ----------------------------------------------------------------------------
    def _unregister(self, worker: WorkerProcess) -> None:
        if worker.released:  # unregistered when it died; its fd number may be a newer worker's now
            return
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(worker.fd)

    def _retire(self, worker: WorkerProcess, why: str) -> None:
        """Close its stdin and move on; its EOF (through the selector) reaps it."""
        worker.end = worker.end or why
        worker.retiring = True
        worker.close()

    def shutdown(self, force: bool = False) -> None:
        """Stop every worker still running: EOF on stdin, SIGKILL after a grace period (or at once).

        Every result is in by now, so nothing waits on a worker one at a time:
        all get EOF together, the grace period is shared, and whatever is left
        after it is killed as a group (its compile subprocesses with it).  The
        forks of a warm server are not waited for at all: the server kills what
        is left of a run's workers and reaps them when the run lets go of it
        (:meth:`Launcher.stop`), and a GPU worker's exit (its CUDA context torn
        down) took 0.3-0.9 s of a one-op run's wall on the H200.
        """
        t = time.monotonic()
        for worker in self.workers:
            worker.retiring = True
            worker.end = worker.end or ("run interrupted" if force else "run finished")
            worker.close()
            self._unregister(worker)
        grace = t + (0.0 if force else SHUTDOWN_GRACE_S)
        left = [w for w in self.workers if not w.left_to_server and w.proc.poll() is None]
        while left and time.monotonic() < grace:
            time.sleep(0.01)
            left = [w for w in left if w.proc.poll() is None]
        for worker in left:
            worker.kill_group()
        for worker in self.workers:
            if not worker.left_to_server:
                worker.wait(timeout=1.0)
            worker.release()
        self.launcher.stop()
        self._sel.close()
        self.shutdown_s = time.monotonic() - t


def lends_gpus(gpus: Sequence[Gpu], gpu_workers: int) -> bool:
    """Host lanes join the GPU lanes only where the GPUs are shared already (several workers each)."""
    return gpu_workers > 1 and bool(gpus)


def _error(reason: str) -> dict[str, Any]:
    return {"checks": [], "kernels": [], "reason": reason, "verdict": "error"}


def _append(path: Path, line: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(line + "\n")


def _lines(path: Path) -> list[str] | None:
    """A log's non-blank lines (None when it cannot be read)."""
    try:
        return [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return None


def _cell_output_tail(path: Path) -> str:
    """The last line the cell itself printed to its log ('' when only opgate's own lines are there)."""
    lines = _lines(path)
    if not lines or lines[-1].startswith("==="):
        return ""
    return lines[-1].strip()[:200]


def _last_line(path: Path) -> str:
    lines = _lines(path)
    if lines is None:
        return "no worker log"
    return lines[-1][:300] if lines else "worker printed nothing"
