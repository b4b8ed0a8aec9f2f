"""``opgate run``: cells -> workers -> results.json, junit.xml, per-cell files.

The runner decides *what* runs here (:mod:`validators.device`), serves
unchanged cells from the verdict cache (:mod:`validators.cache`), hands the
rest to the worker pool (:mod:`validators.pool`), turns attempts into one
:class:`CellResult` each (:mod:`validators.attempts`: failures re-run once in
a fresh process to tell flaky from broken), and writes every output.  Each
cell's record is written the moment it is final, so a run killed halfway keeps
what it finished.

Output folder::

    results.json        RunResults: every cell of this torch version (ran, cached or skipped),
                        and the environment controls that ran (validators.controls)
    junit.xml           one testsuite per op, one testcase per cell
    cells/<id>.json     one CellResult each, written as the cell finishes
    cells/skipped.jsonl the cells this machine cannot run (one record per line, known from the plan)
    controls/<id>.json  one per environment control that ran
    logs/<id>.log       the worker's stdout/stderr while it ran the cell (crash and hang dumps too)
    logs/workers/*.log  each worker's own stderr (start-up problems)
    run.json            timings, cached cells, and which worker served which cells
    planned.json        the cells this run set out to produce (an interrupted run's missing ones)
    .opgate.lock        held while the run writes here: a second run on this folder is refused
    work/<id>/          the cell's scratch folder (build products, exported packages)
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from opgate.matrix.cell import Cell
from opgate.matrix.errors import CellsFailed
from opgate.matrix.files import write_output
from opgate.validators import (
    bytecode,
    controls,
    device,
    earlystart,
    env,
    precompiling,
    retry_gate,
    tritonvariants,
)
from opgate.validators.attempts import AttemptView, merge_attempts, wants_retry
from opgate.validators.breakdown import breakdown
from opgate.validators.cache import VerdictCache, environment_identity
from opgate.validators.cache import default_root as default_cache_root
from opgate.validators.collect import SKIPPED_FILE, write_planned, write_run
from opgate.validators.cuda_build import LIBRARIES_VARIABLE, looks_built
from opgate.validators.device import Gpu, MachineShare, Placement, plan_cells
from opgate.validators.lanes import gpu_lanes
from opgate.validators.limits import memory_for, timeout_for
from opgate.validators.options import RunOptions, repro_command
from opgate.validators.outdir import clear_outputs, write_json
from opgate.validators.outlock import OutputLock
from opgate.validators.pool import Attempt, Pool, Task, lends_gpus
from opgate.validators.progress import Progress, format_summary
from opgate.validators.result import CellResult, RunResults, Verdict, encode_record
from opgate.validators.schedule import History, expected_costs, host_lanes, longest_first, prerequisites
from opgate.validators.workerproc import Launcher, WorkerConfig

if TYPE_CHECKING:
    from collections.abc import Callable

    from opgate.matrix.changes import Affected


#: Records a cell's final attempt; returns the tasks that follow from it (its control, re-runs of
#: the cells that waited on a control).
Settle: TypeAlias = "Callable[[Task, list[AttemptView]], list[Task]]"
#: Cached verdicts served per step of the pool's loop (~1 ms each): the pool looks at its workers
#: between steps.
SERVE_STEP = 16


def _rerun(task: Task) -> Task:
    """The task's next attempt, in a fresh worker."""
    return replace(task, attempt=task.attempt + 1, fresh=True)


def _say(text: str) -> None:
    """Print the summary; a closed stdout (``| head``) must not turn a finished run into a traceback."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's own flush at exit too


def _counted(steps: Iterator[list[Task]], progress: Progress) -> Iterator[list[Task]]:
    """``steps``, with the progress total raised by the cells they add (cached records that did not load)."""
    for more in steps:
        progress.total += sum(not controls.is_control(t.cell) for t in more)
        yield more


def _built_already(name: str, sources: Any, impl: Any) -> bool:
    """Whether library ``name`` of ``impl`` is in the build cache for this torch (no torch import)."""
    return looks_built(name, sources, impl.sass, impl.ptx, device.installed_torch())


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class Runner:
    """One ``validators run``: plan, serve cached verdicts, run the pool, write every output.

    Fixed costs come first and overlap: the cache is asked which cells must run
    before any worker exists (nothing to run: no worker, no fork server, no
    torch import at all), the fork servers of exactly the kinds that will run
    start importing at once, and the cached verdicts are served while they do.
    Only a GPU op whose sources changed since its Triton variants were stored,
    and whose verdicts are not stored, starts its precompile and workers
    beside the lookup (:meth:`_start_early`): its cells run in any case.
    """

    def __init__(self, options: RunOptions, python: str = sys.executable) -> None:
        self.options = options
        self.python = python
        self.out = Path(options.out)
        self.ops_paths = [Path(p).resolve() for p in options.ops_paths]
        self._rng = random.SystemRandom()
        self._env: dict[str, Any] | None = None
        self._probe: dict[str, Any] | None = None
        self._pool: Pool | None = None
        self._launcher: Launcher | None = None
        self._cache: VerdictCache | None = None
        self._history = History(None, {})
        self._specs: dict[str, Any] = {}
        self._plan = MachineShare()
        self._lock = OutputLock(self.out, "opgate run")
        self.cached: list[str] = []
        self.results: dict[str, CellResult] = {}
        self.controls: dict[str, CellResult] = {}
        self._encoded: dict[str, tuple[CellResult, str]] = {}  # cell id -> (record, its results.json line)
        #: control id -> the op cell whose failure scheduled it (a control is re-run through that cell)
        self._scheduled_controls: dict[str, Cell] = {}
        self._controls_running: set[str] = set()  # control tasks handed to the pool, not yet recorded
        self._gate = retry_gate.RetryGate()  # failed cells waiting on their control before a re-run
        self._gpus: list[Gpu] = []
        self.changes: Affected | None = None
        self.timings: dict[str, float] = {}
        self._t0 = time.monotonic()  # the run's start (reset by execute)
        self._bytecode = bytecode.Decision(None, "not decided: the run did not start")
        self._precompiles = precompiling.RunPrecompile(self.out, python)  # the changed ops' Triton variants

    def env(self, *, probe: bool = True) -> dict[str, Any]:
        """The fingerprint: the GPU probe's, a worker's, a cached record's, the last run's, or a probe
        (``probe``: not for an interrupted run, which says it was not probed instead)."""
        if self._env is not None:
            return self._env
        fp = (self._pool.fingerprint if self._pool else {}) or self._probe or {}
        fp = fp or (self.results[self.cached[0]].env if self.cached else {}) or self._history.fingerprint
        if not fp and not self._plan.cells:  # nothing to describe: no torch import for it either
            fp = env.Fingerprint(error="no cell to run: the environment was not probed").to_json()
        if not fp and not probe:
            fp = env.Fingerprint(error="the run was interrupted before the environment was probed").to_json()
        if not fp:
            try:
                fp = env.probe(self.python)
            except (OSError, RuntimeError, ValueError) as exc:
                fp = env.Fingerprint(error=f"environment probe failed: {exc}").to_json()
        found = {v: p for v, p in self._plan.nvcc.items() if p}
        self._env = {**fp, "nvcc": {**(fp.get("nvcc") or {}), **found}} if found else dict(fp)
        return self._env

    @property
    def owns_output(self) -> bool:
        """True once this run holds ``--out`` (and may write, or collect, there)."""
        return self._lock.held

    def release(self) -> None:
        self._lock.release()

    def execute(self) -> tuple[RunResults, int]:
        """Run every cell; the output folder is released at the end, except on an interrupt.

        An interrupted run keeps its hold so the caller can collect the
        finished cells before anyone else writes there (then :meth:`release`).
        """
        try:
            result = self._execute()
        except KeyboardInterrupt:
            with contextlib.suppress(Exception):  # known from the plan: collect lists them as skipped
                self._store_skips(probe=False)
            raise
        except BaseException:
            self.release()
            raise
        self.release()
        return result

    def _execute(self) -> tuple[RunResults, int]:
        t0, started = time.monotonic(), _now()
        self._t0 = self._served_at = t0
        self._bytecode = bytecode.apply()  # before any child process imports torch (probe, servers)
        self._prepare()
        self.timings["prepare_s"] = time.monotonic() - t0  # specs, cells, the plan, cache and history
        early = self._start_early()  # beside the lookup: its waits are on the servers' sockets
        try:
            self._plan_and_run(early, t0)
        except BaseException:  # an error or an interrupt: nothing started for this run outlives it
            with contextlib.suppress(BaseException):
                early.join()  # what the starts started is known, and stopped with the rest
            self._abandon()
            raise
        finally:
            early.release()
        self.timings["served_s"] = self._served_at - t0
        self._store_skips()
        self._link_controls()
        run = RunResults(
            cells=[self.results[c.id] for c in self._plan.cells if c.id in self.results],
            env=self.env(),
            started_at=started,
            finished_at=_now(),
            argv=list(self.options.argv),
            planned=len(self._plan.cells),
            missing=[c.id for c in self._plan.cells if c.id not in self.results],
            controls=[self.controls[k] for k in sorted(self.controls)],
        )
        self.timings["recorded_s"] = time.monotonic() - t0  # pool ended, skips and controls recorded
        doc = write_run(run, self.out, self._encoded)
        self.timings["written_s"] = time.monotonic() - t0  # results.json and junit.xml
        self._remember(run)
        self.timings["wall_s"] = time.monotonic() - t0
        write_json(self.out / "run.json", self._run_record(doc["cells"], doc.get("controls") or []))
        other, wall = self._plan.other_torch, self.timings["wall_s"]
        _say(format_summary(run, wall, other, self.out, cached=len(self.cached)))
        return run, (CellsFailed.exit_code if any(c.verdict.is_bad for c in run.cells) else 0)

    def _plan_and_run(self, early: earlystart.Starts, t0: float) -> None:
        """Look the verdicts up (beside the early starts), order the cells to run, run them."""
        if self.changes is not None:
            _say(f"opgate: {self.changes.describe()}")
        placements = self._plan.placements
        placed = [c for c in self._plan.cells if placements[c.id].kind]
        cache = self._cache if self._may_serve() else None
        try:
            stored = {c.id for c in placed if cache is not None and cache.has(c, self._specs[c.op])}
        finally:
            self.timings["lookup_s"] = time.monotonic() - t0  # which verdicts the cache holds
        early.join()  # after the lookup: a lookup that raised is not hidden by a start that failed
        kinds = [str(placements[c.id].kind) for c in placed if c.id not in stored]  # of the cells to run
        self._start_servers(set(kinds))
        self._prefork(kinds.count("cuda"))
        self.timings["servers_at_s"] = time.monotonic() - t0  # servers asked for, GPU workers forked
        runnable = [c for c in placed if c.id not in stored]
        changed = [c.id for c in runnable] if self._may_serve() else []  # a miss: its op changed
        costs = expected_costs(runnable, self._history, changed)
        tasks = [self._task(c, placements[c.id]) for c in longest_first(runnable, costs)]
        serving = self._serve_stored([c for c in placed if c.id in stored], placements)
        if not tasks:  # nothing to overlap with: served now (a record that does not load still runs)
            tasks = [t for step in serving for t in step]
            serving = iter(())
        self.timings["plan_s"] = time.monotonic() - t0
        if tasks:
            self._run(tasks, costs, serving)
        else:  # what _start_early started for an op whose verdicts were stored after all
            self._precompiles.stop()
            if self._launcher is not None:
                self._launcher.stop()

    def _abandon(self) -> None:
        """A run that raises stops what it started: the precompile, the servers, the early workers.

        The pool stops its own workers and the servers when it ends, however it
        ends; this covers what was started before it existed (by the early
        starts, or the servers asked for after the lookup).
        """
        self._precompiles.stop()
        if self._launcher is not None:
            with contextlib.suppress(Exception):
                self._launcher.stop()

    def _prepare(self) -> None:
        """Cells and specs (once), --changed-since, the GPU list, the plan, the cache and history."""
        from opgate.matrix import expand_torches, narrow
        from opgate.matrix.config import load_config
        from opgate.matrix.spec import load_specs

        opts = self.options
        self._specs = dict(load_specs(self.ops_paths))
        universe = expand_torches(load_config(opts.config), self._specs, None)
        cells = narrow(universe, opts.select, opts.skip)
        if opts.changed_since is not None:
            from opgate.matrix.changes import narrow_to_changes

            cells, self.changes = narrow_to_changes(cells, self._specs, opts.config, opts.changed_since)
        # the inputs are good (a bad one is an error that loses nothing): the output folder is this
        # run's from here, before the probe and the plan, so no earlier run's results outlive a stop now
        self._lock.acquire()
        clear_outputs(self.out)
        self._precompiles.clear()
        t = time.monotonic()
        listed, self._probe = env.visible_gpus(self.python)
        self.timings["probe_s"] = time.monotonic() - t
        self._gpus = device.gpus_from_fingerprint({"gpus": listed})
        finder = device.default_nvcc_finder()
        torch_cuda = device.installed_torch_cuda()
        self._plan = plan_cells(
            cells, self._specs, device.installed_torch(), self._gpus, finder, torch_cuda=torch_cuda
        )
        identity = environment_identity(listed, self._plan.nvcc)
        root = opts.cache_dir or default_cache_root()
        self._cache = VerdictCache(root, identity)
        self._history = History.load(root, identity)
        write_planned(self.out, [c.id for c in self._plan.cells])

    def _serve_stored(
        self, cells: Sequence[Cell], placements: Mapping[str, Placement]
    ) -> Iterator[list[Task]]:
        """Serve the stored verdicts of ``cells``, a few per step; each step's tasks still have to run.

        The pool takes these steps between its polls (:meth:`Pool.run`), so
        the lanes start the changed cells while the unchanged ones are served:
        on the H200, serving 540 cached verdicts took 0.4-0.7 s, during which
        the lanes of a one-op run used to wait.  A record that does not load
        is a cell to run; a cached failure brings its control, and an
        ``environment`` verdict the control stored beside it.
        """
        for start in range(0, len(cells), SERVE_STEP):
            more: list[Task] = []
            for cell in cells[start : start + SERVE_STEP]:
                if not self._serve_cached(cell):
                    more.append(self._task(cell, placements[cell.id]))
                    continue
                cached = self.results[cell.id]
                more += self._control_tasks(cached)  # a cached failure needs its control too
                control = controls.control_of(cached.cell)
                if (
                    cached.verdict is Verdict.ENVIRONMENT
                    and control is not None
                    and control.id not in self.controls
                ):
                    self._serve_cached(control)  # stored beside it: the control that explains it
            self._served_at = time.monotonic()
            yield more

    def _may_serve(self) -> bool:
        """Never with ``--no-cache``, nor with ``--seed`` (a repro asks for those very inputs)."""
        return self.options.use_cache and self.options.seed is None

    def _serve_cached(self, cell: Cell) -> bool:
        """Serve an unchanged cell's verdict (see :meth:`_may_serve`)."""
        if not self._may_serve() or self._cache is None:
            return False
        hit = self._cache.get(cell, self._specs[cell.op], self._log(cell))
        if hit is not None:
            self.cached.append(cell.id)
            self._store(hit)
        return hit is not None

    def _jobs(self) -> int:
        return self.options.jobs or device.default_jobs()

    def _start_servers(self, kinds: set[str]) -> None:
        """Fork servers for the kinds of cells that will run, started now (they import meanwhile)."""
        if kinds:
            self._make_launcher().prestart(sorted(kinds))  # made early (_start_early): kinds it lacks join

    def _make_launcher(self) -> Launcher:
        """The run's launcher (made once; it starts no server by itself)."""
        if self._launcher is not None:
            return self._launcher
        jobs, gpus = self._jobs(), self._gpus
        config = WorkerConfig(
            logs=self.out / "logs" / "workers",
            ops_paths=self.ops_paths,
            threads=device.threads_per_worker(jobs + len(gpus) * self.options.gpu_workers),
            python=self.python,
            fork_server=os.environ.get("OPGATE_FORK_SERVER", "1") != "0",
            keep_warm_s=60.0 * (self.options.keep_warm_min or 0.0),
            # a spec's ``libraries`` are for GPU cells to load: built by build cells only where some
            # GPU can load them (on a CPU machine a CUDA torch's build cell would compile C++ for nobody)
            # and their Triton variants recorded for the next run of their op (validators/tritonvariants.py)
            extra_env=(
                {LIBRARIES_VARIABLE: "1", tritonvariants.RUN_VARIABLE: str(self._precompiles.recordings)}
                if gpus
                else {}
            ),
        )
        self._launcher = Launcher(config)
        return self._launcher

    def _prefork(self, cuda_cells: int) -> None:
        """Start the GPU lanes' first workers now if their server is ready (a warm one).

        A one-op run on the H200 planned for 0.7-1.1 s (``plan_s``), the cached
        verdicts served last, and only then did its GPU workers start, each
        taking 1-2 s to make its CUDA context among the others: now the
        contexts are made while the verdicts are served.  Never more workers
        than cuda cells, never while the server still imports (a fork would
        block on it: cold runs wait for the imports in the pool, as before),
        and never without a server.
        """
        launcher = self._launcher
        if (
            cuda_cells <= 0
            or launcher is None
            or not launcher.forks("cuda")
            or not launcher.startable("cuda")
        ):
            return
        lanes = gpu_lanes(self._gpus, self.options.gpu_workers)[:cuda_cells]
        launcher.prefork("cuda", lanes)

    def _run(
        self, tasks: list[Task], costs: Mapping[str, float], serving: Iterator[list[Task]] | None = None
    ) -> None:
        opts = self.options
        if self._launcher is None:  # a cached record that did not load: its kind had no server yet
            self._start_servers({t.kind for t in tasks})
        assert self._launcher is not None
        lanes = len(self._gpus) * opts.gpu_workers
        lend = lends_gpus(self._gpus, opts.gpu_workers)
        host = host_lanes(tasks, costs, self._jobs(), lanes, self._history, lend=lend)
        self._pool = pool = Pool(
            self._launcher.config,
            host,
            self._gpus,
            keep_spare=opts.retries > 0,
            gpu_workers=opts.gpu_workers,
            launcher=self._launcher,
        )
        progress = Progress(sum(not controls.is_control(t.cell) for t in tasks), enabled=opts.progress)
        attempts: dict[str, list[AttemptView]] = {}

        def on_done(task: Task, attempt: Attempt) -> list[Task]:
            view = AttemptView.of(attempt)
            views = attempts.setdefault(task.cell.id, [])
            views.append(view)
            if wants_retry(view, task.attempt, opts.retries):
                return self._retry_or_wait(task, views, settle)
            return settle(task, views)

        def settle(task: Task, views: list[AttemptView]) -> list[Task]:
            result = self._record(task.cell, views, task.seed)
            if controls.is_control(task.cell):
                self._controls_running.discard(task.cell.id)
                return [t for p in self._gate.release(task.cell.id) for t in self._after_control(p, settle)]
            progress.update(result)
            return self._control_tasks(result)

        # the GPU cells' ops and their sources' digests now: what the variants this run compiles are of
        digests = tritonvariants.gpu_ops(tasks, self._specs, self._cache.op_digest) if self._cache else {}
        # the changed ops the early start did not precompile (it started those whose cells surely run)
        self._start_precompile(self._changed_variants(digests), lanes + host, [t.cell.id for t in tasks])
        t = time.monotonic()
        try:
            after = prerequisites(tasks, self._specs, _built_already)
            pool.run(tasks, on_done, _counted(serving, progress) if serving is not None else None, after)
            for parked in self._gate.leftover():  # a control that never reported: record as they are
                settle(parked.task, parked.views)
        finally:
            progress.close()
            self.timings["pool_s"] = time.monotonic() - t
            self.timings["shutdown_s"] = pool.shutdown_s
            self._precompiles.stop()
            self._store_variants(digests)
            self.timings["variants_s"] = time.monotonic() - t - self.timings["pool_s"]  # stop and store

    def _start_early(self) -> earlystart.Starts:
        """Beside the cache lookup, what a changed GPU op's cells need (:mod:`validators.earlystart`).

        Two threads: the lanes' first workers from the cuda server, the
        precompile from the build server; each waits on its server's socket
        while the other and the lookup work.
        """
        if not self._gpus or self._cache is None:
            return earlystart.Starts()
        placements = self._plan.placements
        kinds = {c.id: placements[c.id].kind for c in self._plan.cells}
        early = earlystart.plan(
            self._plan.cells, kinds, self._specs, self._cache, self._history, may_serve=self._may_serve()
        )
        if early is None:
            return earlystart.Starts()
        lanes = len(self._gpus) * self.options.gpu_workers + self._jobs()
        self._make_launcher()  # made here: the two starts, each in its thread, ask for its servers

        def workers() -> None:  # the lanes' first workers: standbys of a warm server take 0.1 s
            self._start_servers({"cuda"})
            self._prefork(early.gpu_cells)
            self.timings["early_workers_s"] = time.monotonic() - self._t0

        def precompile() -> None:  # forked from the build server, when it is warm
            if early.builds:
                self._start_servers({"build"})
            self._start_precompile(early.variants, lanes, early.order)
            self.timings["early_precompile_s"] = time.monotonic() - self._t0

        return earlystart.Starts(workers, precompile)

    def _changed_variants(self, digests: Mapping[str, str]) -> tritonvariants.Variants:
        """The stored Triton variants of the op implementations in ``digests`` whose sources changed."""
        if not self._gpus or self._cache is None:
            return {}
        return tritonvariants.Store.beside(self._cache).changed(digests)

    def _start_precompile(self, variants: tritonvariants.Variants, lanes: int, order: Sequence[str]) -> None:
        """The changed ops' Triton variants, compiled on the cores the lanes leave idle (precompiling)."""
        if not self._gpus or self._launcher is None or self._cache is None:
            return
        self._precompiles.start(
            variants,
            launcher=self._launcher,
            gpu=self._gpus[0],
            sys_path=sorted({str(s.root) for s in self._specs.values() if getattr(s, "root", None)}),
            lanes=lanes,
            order=order,
        )

    def _store_variants(self, digests: Mapping[str, str]) -> None:
        """What this run's GPU cells compiled, kept for their op's next change."""
        if self._cache is None:
            return
        cached = set(self.cached)
        ran = [i for i, r in self.results.items() if i not in cached and r.verdict is not Verdict.ERROR]
        self._precompiles.store(self._cache, digests, ran)

    def _retry_or_wait(self, task: Task, views: list[AttemptView], settle: Settle) -> list[Task]:
        """A re-run now, or the control first and the re-run after it (:mod:`validators.retry_gate`)."""
        control = controls.control_of(task.cell)
        mine = retry_gate.provisional(task.cell, views)
        if control is None or controls.failure_kind(mine) is None:
            return [_rerun(task)]
        scheduled = self._control_tasks(mine)
        parked = retry_gate.Parked(task, views)
        if control.id in self.controls:  # in already, or served from the verdict cache just now
            return self._after_control(parked, settle)
        if control.id not in self._controls_running:  # no control can run here
            return [_rerun(task)]
        self._gate.park(control.id, task, views)
        return scheduled

    def _after_control(self, parked: retry_gate.Parked, settle: Settle) -> list[Task]:
        """Recorded as it is when its control failed alike, re-run otherwise."""
        task, views = parked.task, parked.views
        control = controls.control_of(task.cell)
        assert control is not None  # only cells of controlled modes wait on a control
        if controls.fails_alike(retry_gate.provisional(task.cell, views), self.controls[control.id]):
            return settle(task, views)
        return [_rerun(task)]

    def _control_tasks(self, result: CellResult) -> list[Task]:
        """The control a failed cell needs, once per group (none when cached, scheduled or not needed)."""
        control = controls.control_of(result.cell)
        if control is None or result.verdict not in controls.EXCUSABLE:
            return []
        if control.id in self._scheduled_controls or control.id in self.controls:
            return []
        self._scheduled_controls[control.id] = result.cell
        if self._serve_cached(control):
            return []
        placement = device.place(control, self._gpus)
        if placement.kind is None:
            return []
        self._controls_running.add(control.id)
        return [self._task(control, placement)]

    def _link_controls(self) -> None:
        """Every op cell of a group whose control ran gets it beside it (and ``environment`` if alike).

        An ``environment`` cell is cached with its control (a cached one already carries it): the
        same sources in the same environment are the environment's again, without crashing twice.
        """
        stored: set[str] = set()  # controls put beside an environment cell (one control, many cells)
        for result in list(self.results.values()):
            linked = controls.linked(result, self.controls)
            if linked is result:
                continue
            self._store(linked)
            control = controls.control_of(result.cell)
            if linked.verdict is not Verdict.ENVIRONMENT or self._cache is None or control is None:
                continue
            spec = self._specs[result.cell.op]
            self._cache.put(linked, spec, self._log(result.cell))
            if control.id not in stored:
                stored.add(control.id)
                self._cache.put(self.controls[control.id], spec, self._log(control), explains=True)

    def _remember(self, run: RunResults) -> None:
        """What the cells that ran took (the next run's costs), and this environment's fingerprint."""
        ran = {c.id: c.duration_s for c in run.cells if c.id not in self.cached and c.verdict.ran}
        if not ran and self._history.fingerprint:
            return
        self._history.update(ran)
        if not run.env.get("error"):
            self._history.fingerprint = dict(run.env)
        with contextlib.suppress(OSError):  # a read-only cache costs the next run its order, not this run
            self._history.save()

    def _task(self, cell: Cell, placement: Placement) -> Task:
        seed = self.options.seed if self.options.seed is not None else self._rng.randrange(2**31)
        return Task(
            cell=cell,
            kind=str(placement.kind),
            arch=placement.arch,
            seed=seed,
            timeout_s=timeout_for(cell, self.options.timeout_s),
            memory_mb=memory_for(cell, self.options.memory_mb),
            log=self._log(cell),
            workdir=self.out / "work" / cell.id,
            fresh=placement.isolate,
        )

    def _log(self, cell: Cell) -> Path:
        return self.out / "logs" / f"{cell.id}.log"

    def _repro(self, cell: Cell, seed: int | None) -> str:
        return repro_command(cell.id, seed, self.options)

    def _record(self, cell: Cell, views: Sequence[AttemptView], seed: int) -> CellResult:
        verdict, checks, kernels, reason = merge_attempts(views)
        result = CellResult(
            cell=cell,
            verdict=verdict,
            env=self.env(),
            checks=checks,
            kernels=kernels,
            duration_s=sum(v.duration_s for v in views),
            setup_build_s=sum(v.setup_build_s for v in views),
            setup_wait_s=sum(v.setup_wait_s for v in views),
            reason=reason,
            seed=seed,
            repro=self._repro(self._scheduled_controls.get(cell.id, cell), seed),
            attempts=len(views),
        )
        self._store(result)
        if self._cache is not None:  # the cell's own verdict: controls are linked afresh every run
            self._cache.put(result, self._specs[cell.op], self._log(cell))
        return result

    def _store_skips(self, *, probe: bool = True) -> None:
        """The cells this machine cannot run, in one file (``cells/skipped.jsonl``), not one file each.

        They are known from the plan; on a CPU machine they are most of the
        matrix (every GPU cell), and a file per record costs an open per cell.
        Written at the run's end, or when it is interrupted (``probe``: False
        then, no torch import to describe the environment while it stops).
        """
        if not self.owns_output:
            return
        skips = [
            CellResult(
                cell, Verdict.SKIP, self.env(probe=probe), reason=reason, repro=self._repro(cell, None)
            )
            for cell in self._plan.cells
            if cell.id not in self.results and (reason := self._plan.placements[cell.id].skip_reason)
        ]
        if not skips:
            return
        self.results.update((r.id, r) for r in skips)
        self._encoded.update((r.id, (r, encode_record(r.to_json()))) for r in skips)
        lines = "".join(self._encoded[r.id][1] + "\n" for r in skips)
        write_output(self.out / "cells" / SKIPPED_FILE, lines, atomic=True)

    def _store(self, result: CellResult) -> None:
        if controls.is_control(result.cell):
            self.controls[result.id] = result
            write_json(self.out / "controls" / f"{result.id}.json", result.to_json(), indent=None)
            return
        self.results[result.id] = result
        # encoded once: the cell's file now, its line of results.json at the end (write_run). Encoded
        # again there, writing results.json and junit.xml took 0.215 s of a one-op run's end on the
        # H200, every lane idle; 0.059 s with this and junit's indent (h200-speed-standby-13, -14)
        line = encode_record(result.to_json())
        self._encoded[result.id] = (result, line)
        write_output(self.out / "cells" / f"{result.id}.json", line + "\n", atomic=True)

    def _run_record(
        self, cells: Sequence[Mapping[str, Any]], control_docs: Sequence[Mapping[str, Any]]
    ) -> dict[str, Any]:
        """Timings, cached cells and which workers served which cells, and the time breakdown from them."""
        pool = self._pool
        record: dict[str, Any] = {
            "timings": {k: round(v, 3) for k, v in self.timings.items()},
            "fork_server_preload_s": dict(self._launcher.preload_s) if self._launcher else {},
            "warm_servers": dict(self._launcher.warm) if self._launcher else {},
            # how the workers' C++ compiles were cached (validators/compilercache.py), or why not
            "compiler_cache": self._launcher.config.compiler_cache().record() if self._launcher else {},
            # where the run's processes cached Python bytecode, or why they did not (validators/bytecode.py)
            "bytecode_cache": self._bytecode.to_json(),
            # the changed ops' Triton variants compiled ahead of their cells, and what the run recorded
            "triton_precompile": self._precompiles.summary,
            "other_torch_cells": self._plan.other_torch,
            "cached_cells": self.cached,
            # times from the run's start: a lane's wait for its first worker includes the planning
            "workers": [w.record(self._t0) for w in pool.workers] if pool else [],
        }
        record["breakdown"] = breakdown(cells, record, control_docs)
        return record
