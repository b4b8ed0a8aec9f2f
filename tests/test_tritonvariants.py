"""A changed op's Triton variants: recorded by workers, stored per op, compiled ahead from what was stored."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402 - after the skip
from triton.runtime.jit import JITFunction  # noqa: E402

from opgate.validators import tritonvariants  # noqa: E402


def _axpy_source(x, y, out, n, ALPHA: tl.constexpr, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]  # noqa: PLR0917
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out + offs, ALPHA * tl.load(x + offs, mask=mask) + tl.load(y + offs, mask=mask), mask=mask)


#: A compiled kernel even where the tests run under ``TRITON_INTERPRET=1`` (``triton.jit`` would
#: give the interpreter's function, which nothing compiles).
_axpy = JITFunction(_axpy_source)


#: What Triton's binder makes of a launch with fp16 tensors aligned to 16 bytes, ``n % 16 == 0``
#: and two constexprs; the arguments' values in order.
SPECIALIZATION = [
    ("*fp16", "D"),
    ("*fp16", "D"),
    ("*fp16", "D"),
    ("i32", "D"),
    ("constexpr", 2),
    ("constexpr", 128),
]
BOUND = {"x": None, "y": None, "out": None, "n": 1024, "ALPHA": 2, "BLOCK": 128}


def _launch(target: dict[str, Any]) -> tuple[Any, Any, Any, Any]:
    """The launch's own compile inputs: Triton's ``_pack_args``, as ``JITFunction.run`` calls it."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend

    backend = make_backend(GPUTarget(**target))
    return _axpy._pack_args(backend, {"num_warps": 4}, BOUND, SPECIALIZATION, None)  # type: ignore[no-any-return]


def _variant(target: dict[str, Any]) -> dict[str, Any]:
    """What a worker's hook records for that launch: Triton's own serialization of those inputs."""
    from triton.backends.compiler import GPUTarget
    from triton.runtime.jit import serialize_specialization_data

    options, signature, constexprs, attrs = _launch(target)
    args = ["_axpy", signature, constexprs, attrs, options, "key"]
    try:
        data = serialize_specialization_data(*args, GPUTarget(**target))  # Triton >= 3.7 stores it
    except TypeError:
        data = serialize_specialization_data(*args)
    return {"module": __name__, "name": "_axpy", "data": data, "target": target}


def _cache_entries(cache: Path) -> set[str]:
    return {p.parent.name for p in cache.rglob("*.cubin")}


def _in_a_compiling_process(body: str, tmp_path: Path) -> None:
    """Run ``body(tmp_path)`` of this module in a fresh interpreter that can compile.

    The tests session runs under ``TRITON_INTERPRET=1``, and Triton's language imported so is the
    interpreter's for good (nothing compiles in this process), as in a CPU worker; a GPU worker,
    a build server's fork and a precompile process import it without.
    """
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton")
    root = str(Path(__file__).resolve().parent.parent)
    code = f"import sys; sys.path.insert(0, {root!r}); import tests.test_tritonvariants as t; t.{body}"
    code += f"({str(tmp_path)!r})"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.integration
def test_a_stored_variant_compiles_into_the_cache_key_its_launch_would_use(tmp_path: Path) -> None:
    _in_a_compiling_process("same_key", tmp_path)


def same_key(tmp: str) -> None:
    """A recorded variant, compiled from its JSON, and the launch's own compile: one cache entry."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile  # noqa: A004

    tmp_path = Path(tmp)
    target = {"backend": "cuda", "arch": 90, "warp_size": 32}
    tritonvariants.compile_variant(_variant(target))
    made = _cache_entries(tmp_path / "triton")
    assert len(made) == 1  # one variant, one sm_90 cubin
    # the launch's own compile (JITFunction._do_compile): the objects before any JSON
    options, signature, constexprs, attrs = _launch(target)
    src = ASTSource(_axpy, signature, constexprs, attrs)
    compile(src, target=GPUTarget(**target), options=options.__dict__)
    assert _cache_entries(tmp_path / "triton") == made  # a hit: nothing compiled again


@pytest.mark.integration
def test_precompile_processes_compile_their_share_and_report_a_stale_variant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One interpreter started, a fork of it for the second job: each reports its own share."""
    good = _variant({"backend": "cuda", "arch": 90, "warp_size": 32})
    stale = {**good, "name": "_renamed_kernel"}  # the kernel it was recorded for is gone
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "triton")}
    here = str(Path(__file__).resolve().parent.parent)  # where this module is `tests.test_tritonvariants`
    todo = {"axpy.triton": [good, stale]}
    monkeypatch.setattr(tritonvariants, "PER_PROCESS", 1)  # two variants: two processes
    launch = tritonvariants.fresh_interpreter(env)
    run = tritonvariants.start(tmp_path / "work", todo, cores=8, launch=launch, sys_path=[here])
    assert run is not None
    assert run.proc is not None
    assert len(run.jobs) == 2
    deadline = time.monotonic() + 300
    while run.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert run.proc.poll() == 0  # it waited for its fork
    outs = [_last(job.with_suffix(".out")) for job in run.jobs]
    assert [(o["compiled"], o["failed"]) for o in outs] == [(1, 0), (0, 1)]  # the fork compiled its own
    summary = run.stop()
    totals = (summary["compiled"], summary["failed"], summary["unfinished"], summary["processes"])
    assert totals == (1, 1, 0, 2)
    assert 0 < summary["ready_s"] <= summary["last_compiled_s"]
    assert "_renamed_kernel" in (tmp_path / "work" / "precompile-0.log").read_text()  # the forks' log too
    assert len(_cache_entries(tmp_path / "triton")) == 1


def _last(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text().splitlines()[-1]))


@pytest.mark.integration
def test_a_stopped_precompile_takes_its_forks_with_it(tmp_path: Path) -> None:
    """Killed at the run's end, the started process takes the forks it made (one process group)."""
    jobs = []
    for i in range(3):
        jobs.append(tmp_path / f"precompile-{i}.json")
        jobs[-1].write_text(json.dumps({"sys_path": [], "variants": [{"module": "time", "name": "x"}]}))
    code = (
        "import sys, time; from opgate.validators import tritonvariants as t;"
        "t.compile_variant = lambda v: time.sleep(600); sys.exit(t.run_jobs([__import__('pathlib').Path(a) "
        "for a in sys.argv[1:]]))"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, *map(str, jobs)], start_new_session=True)
    handle = tritonvariants._Session(proc)  # what fresh_interpreter returns
    deadline = time.monotonic() + 60
    forks: list[int] = []
    while len(forks) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
        forks = [int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
    assert len(forks) == 2  # one fork per further job
    assert handle.poll() is None
    handle.kill()
    for pid in forks:
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not Path(f"/proc/{pid}").exists(), f"fork {pid} outlived the precompile"


def test_no_variants_or_switched_off_starts_nothing(tmp_path: Path) -> None:
    def launch(jobs: Sequence[Path]) -> tritonvariants.Handle:
        raise AssertionError(f"started {jobs}")

    assert tritonvariants.start(tmp_path, {}, cores=8, launch=launch, sys_path=[]) is None
    assert tritonvariants.start(tmp_path, {"a.triton": []}, cores=8, launch=launch, sys_path=[]) is None
    off = {tritonvariants.SWITCH: "0"}
    todo: dict[str, list[dict[str, Any]]] = {"a.triton": [{}] * 9}
    assert tritonvariants.start(tmp_path, todo, cores=8, launch=launch, sys_path=[], environ=off) is None
    assert not list(tmp_path.iterdir())  # nothing written either


def test_processes_share_the_variants_as_cores_allow(tmp_path: Path) -> None:
    started: list[Path] = []

    killed: list[str] = []

    class Done:
        def poll(self) -> int | None:
            return 0

        def kill(self) -> object:
            killed.append("group")
            return 0

    def launch(jobs: Sequence[Path]) -> tritonvariants.Handle:
        assert not started  # one process started for them all
        started.extend(jobs)
        return Done()

    todo = {"b.triton": [{"n": i} for i in range(10)], "a.triton": [{"n": 10}]}
    run = tritonvariants.start(tmp_path, todo, cores=2, launch=launch, sys_path=["/r"])
    assert run is not None
    assert len(started) == 2  # 11 variants, 2 idle cores
    shares = [json.loads(p.read_text()) for p in started]
    assert sorted(v["n"] for s in shares for v in s["variants"]) == list(range(11))
    assert {tuple(s["sys_path"]) for s in shares} == {("/r",)}
    started.clear()
    more = tritonvariants.start(tmp_path, todo, cores=16, launch=launch, sys_path=[])
    assert more is not None
    assert len(more.jobs) == 3  # 16 idle cores: one process per PER_PROCESS (4) variants, 11 variants
    summary = run.stop()  # neither said anything: every variant unfinished
    assert (summary["compiled"], summary["unfinished"], summary["processes"]) == (0, 11, 2)
    assert killed == ["group"]  # ended or not: the forks of a first process that crashed go with its group


def _hook_call(module: str, name: str, data: str) -> dict[str, Any]:
    return {"fn": SimpleNamespace(module=module, name=name), "compile": {"specialization_data": data}}


def test_recorder_tags_each_variant_with_the_running_cells_op(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from triton import knobs

    seen: list[str] = []
    monkeypatch.setattr(knobs.runtime, "jit_cache_hook", lambda **kw: seen.append(kw["fn"].name))
    monkeypatch.setattr(tritonvariants, "_target", [{"backend": "cuda", "arch": 90, "warp_size": 32}])
    monkeypatch.setattr(tritonvariants, "_recorded", set())
    assert tritonvariants.install_recorder({tritonvariants.RUN_VARIABLE: str(tmp_path)})
    hook = knobs.runtime.jit_cache_hook
    hook(**_hook_call("m", "before_any_cell", "{}"))  # between cells: not an op's
    tritonvariants.set_current("rope.triton", "rope-cell-1")
    for name in ("k1", "k1", "k2"):  # a variant compiled twice is recorded once
        assert hook(**_hook_call("m", name, json.dumps({"n": name}))) is None  # never skips a compile
    tritonvariants.set_current("rope.triton", "rope-cell-2")
    hook(**_hook_call("m", "k1", json.dumps({"n": "k1"})))  # this process has it: not again
    hook(**_hook_call("m", "k3", json.dumps({"n": "k3"})))
    hook(**_hook_call("m", "f.<locals>.k", "{}"))  # a fresh process could not import it
    tritonvariants.set_current(None)
    assert seen == ["before_any_cell", "k1", "k1", "k2", "k1", "k3", "f.<locals>.k"]  # the earlier hook runs
    lines = [json.loads(x) for x in (tmp_path / "rope.triton.jsonl").read_text().splitlines()]
    assert [(x["name"], x["cells"]) for x in lines] == [
        ("k1", ["rope-cell-1"]),
        ("k2", ["rope-cell-1"]),
        ("k3", ["rope-cell-2"]),
    ]
    assert [p.name for p in tmp_path.iterdir()] == ["rope.triton.jsonl"]


def test_store_merges_newest_first_and_knows_what_changed(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()

    def variant(n: int) -> dict[str, Any]:
        return {"module": "m", "name": f"k{n}", "data": "{}", "target": {}}

    (run / "rope.triton.jsonl").write_text(
        "\n".join(json.dumps(variant(n)) for n in (1, 2, 1)) + "\nnot json\n"
    )
    (run / "other.triton.jsonl").write_text(json.dumps(variant(9)) + "\n")

    def stored(n: int, digest: str) -> dict[str, Any]:
        return {**variant(n), "op_digest": digest}

    store = tritonvariants.Store(tmp_path / "store")
    assert store.merge(run, {"rope.triton": "d1"}) == {"rope.triton": 2}  # only the run's GPU ops
    assert store.read("rope.triton") == ("d1", [stored(1, "d1"), stored(2, "d1")])
    assert store.read("other.triton") == ("", [])
    (run / "rope.triton.jsonl").write_text(json.dumps(variant(3)) + "\n")
    store.merge(run, {"rope.triton": "d2"})
    assert store.read("rope.triton") == ("d2", [stored(3, "d2"), stored(1, "d1"), stored(2, "d1")])
    # k1 and k2 were compiled from d1's sources: a run of d2 still precompiles them, not k3
    assert store.changed({"rope.triton": "d2"}) == {"rope.triton": [stored(1, "d1"), stored(2, "d1")]}
    assert store.changed({"rope.triton": "d3", "new.triton": "x"}) == {
        "rope.triton": store.read("rope.triton")[1]
    }
    (run / "rope.triton.jsonl").write_text("\n".join(json.dumps(variant(n)) for n in (1, 2)) + "\n")
    store.merge(run, {"rope.triton": "d2"})
    assert store.changed({"rope.triton": "d2"}) == {}  # every variant compiled from the sources as they are
    assert [p.name for p in store.folder.iterdir() if p.suffix == ".tmp"] == []


def test_a_run_of_some_cells_leaves_the_others_variants_to_precompile_and_drops_what_no_cell_compiles(
    tmp_path: Path,
) -> None:
    """A change, then a run of a few of the op's cells (``--select``): the variants those cells compiled
    are of the new sources, the others still of the old ones (the next run precompiles them); a
    variant whose cell ran without compiling it is one the kernel no longer has."""
    run = tmp_path / "run"
    run.mkdir()

    def variant(n: int, *cells: str) -> dict[str, Any]:
        return {"module": "m", "name": f"k{n}", "data": "{}", "target": {}, "cells": list(cells)}

    store = tritonvariants.Store(tmp_path / "store")
    before = [variant(1, "bf16-eager"), variant(2, "fp16-eager"), variant(3, "bf16-compile")]
    (run / "rope.triton.jsonl").write_text("\n".join(json.dumps(v) for v in before) + "\n")
    store.merge(run, {"rope.triton": "old"}, ran=["bf16-eager", "fp16-eager", "bf16-compile"])
    # the change: the bf16 cells run alone; bf16-eager compiles k1 again, bf16-compile now compiles k4
    after = [variant(1, "bf16-eager"), variant(4, "bf16-compile")]
    (run / "rope.triton.jsonl").write_text("\n".join(json.dumps(v) for v in after) + "\n")
    store.merge(run, {"rope.triton": "new"}, ran=["bf16-eager", "bf16-compile"])
    _, kept = store.read("rope.triton")
    assert [(v["name"], v["op_digest"]) for v in kept] == [("k1", "new"), ("k4", "new"), ("k2", "old")]
    assert [v["name"] for v in store.changed({"rope.triton": "new"})["rope.triton"]] == ["k2"]


def test_a_store_of_the_earlier_format_is_not_read(tmp_path: Path) -> None:
    """Version 1 kept one digest for the op: read as nothing stored, replaced at the next merge."""
    store = tritonvariants.Store(tmp_path / "store")
    store.folder.mkdir(parents=True)
    variant = {"module": "m", "name": "k", "data": "{}", "target": {}}
    (store.folder / "rope.triton.json").write_text(
        json.dumps({"version": 1, "op_digest": "d", "variants": [variant]})
    )
    assert store.read("rope.triton") == ("", [])
    assert store.changed({"rope.triton": "x"}) == {}


def test_store_keeps_the_cells_of_each_variant_and_the_precompile_follows_the_runs_order(
    tmp_path: Path,
) -> None:
    run = tmp_path / "run"
    run.mkdir()

    def variant(n: int, *cells: str) -> dict[str, Any]:
        return {"module": "m", "name": f"k{n}", "data": "{}", "target": {}, "cells": list(cells)}

    # two workers compiled k1 (each records its own first cell), k2 by one cell, k3 by none of the run
    lines = [variant(1, "c9"), variant(2, "c5"), variant(1, "c2"), {**variant(3), "cells": []}]
    (run / "rope.triton.jsonl").write_text("\n".join(json.dumps(v) for v in lines) + "\n")
    store = tritonvariants.Store(tmp_path / "store")
    assert store.merge(run, {"rope.triton": "d1"}) == {"rope.triton": 3}
    _, kept = store.read("rope.triton")
    assert [(v["name"], v.get("cells")) for v in kept] == [("k1", ["c9", "c2"]), ("k2", ["c5"]), ("k3", None)]
    # the lanes take c2 first, then c5: k1 is needed first (by c2), then k2; k3 by no cell of this run
    assert [v["name"] for v in tritonvariants.needed_first(kept, ["c2", "c7", "c5"])] == ["k1", "k2", "k3"]
    assert [v["name"] for v in tritonvariants.needed_first(kept, ["c5", "c9"])] == ["k2", "k1", "k3"]
    assert [v["name"] for v in tritonvariants.needed_first(kept, [])] == ["k1", "k2", "k3"]  # stored order

    started: list[Path] = []

    class Done:
        def poll(self) -> int | None:
            return 0

        def kill(self) -> object:
            return 0

    def launch(jobs: Sequence[Path]) -> tritonvariants.Handle:
        started.extend(jobs)
        return Done()

    many = [variant(n, f"c{n}") for n in range(8)]
    order = [f"c{n}" for n in (7, 6, 5, 4, 3, 2, 1, 0)]  # the run takes them the other way round
    precompile = tritonvariants.start(
        tmp_path / "w", {"rope.triton": many}, cores=2, launch=launch, sys_path=[], order=order
    )
    assert precompile is not None
    firsts = [json.loads(job.read_text())["variants"] for job in started[-2:]]
    names = [[v["name"] for v in share] for share in firsts]
    assert names == [["k7", "k5", "k3", "k1"], ["k6", "k4", "k2", "k0"]]  # each process: the first needed


def test_a_job_reports_running_totals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def fake_compile(variant: dict[str, Any]) -> None:
        calls.append(variant["name"])
        if variant["name"] == "bad":
            raise ValueError("no such parameter")

    monkeypatch.setattr(tritonvariants, "compile_variant", fake_compile)
    job = tmp_path / "job.json"
    job.write_text(
        json.dumps({"sys_path": [], "variants": [{"module": "m", "name": n} for n in ("a", "bad")]})
    )
    assert tritonvariants.run_jobs([job]) == 0
    lines = [json.loads(x) for x in job.with_suffix(".out").read_text().splitlines()]
    assert [(x["compiled"], x["failed"], x["of"]) for x in lines] == [(1, 0, 2), (1, 1, 2)]
    assert lines[0]["ready_at"] <= lines[0]["at"] <= lines[1]["at"]
    assert calls == ["a", "bad"]


def test_run_scoped_folder_is_not_part_of_a_warm_servers_key() -> None:
    from opgate.validators import warmserver

    env = {"TRITON_CACHE_DIR": "/c", tritonvariants.RUN_VARIABLE: "/out/a/work/triton-variants"}
    other_run = {**env, tritonvariants.RUN_VARIABLE: "/out/b/work/triton-variants"}
    assert warmserver.key(["python"], env) == warmserver.key(["python"], other_run)
    assert warmserver.key(["python"], env) != warmserver.key(["python"], {**env, "TRITON_CACHE_DIR": "/d"})


@pytest.mark.integration
def test_a_worker_given_a_precompile_job_compiles_it_and_exits(tmp_path: Path) -> None:
    _in_a_compiling_process("worker_job", tmp_path)


def worker_job(tmp: str) -> None:
    """A build worker's serve loop given a precompile message instead of a cell."""
    import io

    from opgate.validators import worker

    tmp_path = Path(tmp)
    job = tmp_path / "precompile-0.json"
    here = str(Path(__file__).resolve().parent.parent)
    variant = _variant({"backend": "cuda", "arch": 80, "warp_size": 32})
    job.write_text(json.dumps({"sys_path": [here], "variants": [variant]}))
    sys.stdin = io.StringIO(json.dumps({"type": "precompile", "jobs": [str(job)]}) + "\n")
    channel = io.StringIO()

    def no_cells(*_: Any) -> Any:
        raise AssertionError("a precompile job is not a cell")

    pre = worker.Preloaded("build", 0, {}, no_cells)
    assert worker.serve_loop(channel, pre, time.perf_counter()) == 0
    assert json.loads(channel.getvalue().splitlines()[0])["type"] == "hello"  # then nothing: it exits
    last = json.loads(job.with_suffix(".out").read_text().splitlines()[-1])
    assert (last["compiled"], last["failed"]) == (1, 0)
    assert len(_cache_entries(tmp_path / "triton")) == 1  # an sm_80 cubin


@pytest.mark.integration
def test_a_forked_job_whose_server_is_gone_counts_as_ended(tmp_path: Path) -> None:
    """The pool stops the fork servers at its end, before the run stops its precompile jobs."""
    import socket

    from opgate.validators.forkserver import ForkServer
    from opgate.validators.precompiling import Compiling
    from opgate.validators.workerproc import WorkerProcess

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    child = subprocess.Popen(["sleep", "60"], start_new_session=True)  # the fork, as the server made it
    try:
        theirs.send(json.dumps({"ready": True}).encode())  # a warm server's answers, queued
        theirs.send(json.dumps({"pid": child.pid}).encode())
        server = ForkServer(["python"], {}, tmp_path / "server.log", connection=ours)
        worker = WorkerProcess("precompile-0", "build", ["python"], {}, tmp_path / "w.log", server=server)
        assert worker.forked
        server.stop()  # the socket closed here: no exit report can come any more
        handle = Compiling(worker)
        assert handle.poll() is not None  # orphaned: its server kills it, nobody waits for it
        handle.kill()  # never raises on the closed socket (it raised EBADF and failed the run)
        assert worker.proc.stdin is not None
        assert worker.proc.stdin.closed
        assert child.wait(timeout=10) == -signal.SIGKILL  # its group was killed all the same
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        theirs.close()


class _ReadyBuildServer:
    """A launcher stand-in whose build server is ready: the precompile would fork from it."""

    def forks(self, kind: str) -> bool:
        return True

    def startable(self, kind: str) -> bool:
        return True


#: RunPrecompile.start's arguments besides the variants: one GPU lane, the build server ready.
_START_ARGS: dict[str, Any] = {
    "launcher": _ReadyBuildServer(),
    "gpu": None,
    "sys_path": [],
    "lanes": 1,
    "order": [],
}


def test_a_runs_precompiles_start_each_changed_op_once_and_sum_up_at_the_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The early start precompiles one op; the pool's start the changed ops it did not (their cells
    run too), never the same op twice; the end stops both and run.json gets one summary."""
    from opgate.validators.precompiling import RunPrecompile

    calls: list[tuple[Path, list[str]]] = []

    class Started:
        def __init__(self, n: int) -> None:
            self.n = n

        def stop(self) -> dict[str, Any]:
            return {"ops": {f"op{self.n}.triton": 2}, "processes": 1, "compiled": 2, "failed": 0,
                    "unfinished": 0, "ready_s": 0.1 * self.n, "last_compiled_s": 1.0 * self.n}  # fmt: skip

    def start(work: Path, variants: tritonvariants.Variants, **kw: Any) -> Started:
        calls.append((work, sorted(variants)))
        return Started(len(calls))

    monkeypatch.setattr(tritonvariants, "start", start)
    run = RunPrecompile(tmp_path / "out", sys.executable)

    two = {"op1.triton": [{"n": 1}], "op2.triton": [{"n": 2}]}
    kw = _START_ARGS
    run.start({"op1.triton": two["op1.triton"]}, **kw)  # the early start
    run.start(two, **kw)  # the pool's start: op2 only
    run.start(two, **kw)  # nothing left
    assert [ops for _, ops in calls] == [["op1.triton"], ["op2.triton"]]
    assert calls[0][0] != calls[1][0]  # each its own job folder
    run.stop()
    run.stop()  # once
    assert run.summary == {
        "ops": {"op1.triton": 2, "op2.triton": 2},
        "processes": 2, "compiled": 4, "failed": 0, "unfinished": 0, "ready_s": 0.2, "last_compiled_s": 2.0,
    }  # fmt: skip
    run.start({"op3.triton": [{"n": 3}]}, **kw)
    assert len(calls) == 2  # a stopped run starts nothing more


def test_a_precompile_that_cannot_start_is_said_and_does_not_fail_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from opgate.validators.precompiling import RunPrecompile

    def start(work: Path, variants: tritonvariants.Variants, **kw: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tritonvariants, "start", start)
    run = RunPrecompile(tmp_path / "out", sys.executable)

    kw = _START_ARGS
    run.start({"op1.triton": [{"n": 1}]}, **kw)
    run.stop()
    assert run.summary == {"error": "not started: OSError: [Errno 28] No space left on device"}
