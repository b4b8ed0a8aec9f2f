"""Each Triton kernel compiled once across workers (validators.tritoncache): real Triton compiles.

The kernels are cross-compiled for sm_90 (``triton.compile`` with a
``GPUTarget``), which needs no GPU: the same cache, the same keys and the same
manager calls as a worker's compile on the device.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from opgate.validators import tritoncache
from opgate.validators.tritoncache import LOCK_NAME, MANAGER, VARIABLE, worker_env
from opgate.validators.workerproc import WorkerConfig

pytestmark = pytest.mark.integration  # real Triton compiles in processes of their own

#: A worker in miniature: waits for the start file, compiles one kernel for sm_90 through
#: the manager Triton is configured with, and appends what it did (compiled or found) to a log.
#: A child that missed the cache waits until all the children missed it before
#: it goes on (to compile, or, with the single-flight manager, to take the kernel's lock): all of
#: them then missed, however the machine schedules them.  Without it a child started late finds
#: the first one's kernel, and neither test could tell a working manager from a broken one.
CHILD = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path
    import triton, triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.runtime import cache

    log, start, marker, ready = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
    barrier = int(sys.argv[5])  # children that must have missed before any goes on
    calls = []
    manager = triton.knobs.cache.manager_class or cache.FileCacheManager
    put, get = manager.put_group, manager.get_group
    def counted(self, filename, group):
        calls.append("compiled")
        return put(self, filename, group)
    manager.put_group = counted

    def missed():
        if "missed" in calls:
            return
        calls.append("missed")
        ready.with_name(ready.name + ".missed").touch()
        deadline = time.monotonic() + 60
        while len(list(ready.parent.glob(f"ready_{marker}_*.missed"))) < barrier:
            assert time.monotonic() < deadline, "the other children never missed"
            time.sleep(0.002)

    if manager is cache.FileCacheManager:
        def get_together(self, filename):
            group = get(self, filename)
            if group is None:
                missed()
            return group
        manager.get_group = get_together
    else:  # the single-flight manager takes the kernel's lock after a miss
        from opgate.validators import tritoncache
        acquire = tritoncache._acquire
        def acquire_together(path, wait_s):
            missed()
            return acquire(path, wait_s)
        tritoncache._acquire = acquire_together

    @triton.jit
    def scale(x_ptr, n, BLOCK: tl.constexpr):
        # MARKER
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(x_ptr + i, tl.load(x_ptr + i, mask=i < n) * 2.0, mask=i < n)

    ready.touch()
    while not start.exists():
        time.sleep(0.002)
    src = triton.compiler.ASTSource(
        fn=scale, signature={"x_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}, constexprs={"BLOCK": 128}
    )
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32))
    assert kernel.asm["cubin"], "no cubin"
    with log.open("a") as f:
        f.write(json.dumps({"pid": os.getpid(), "compiled": calls.count("compiled")}) + "\\n")
    """
)


def _child(tmp_path: Path, marker: str) -> Path:
    path = tmp_path / f"child_{marker}.py"
    path.write_text(CHILD.replace("# MARKER", f"# {marker}"))
    return path


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (VARIABLE, "TRITON_INTERPRET")}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton")
    env.update(extra)
    return env


def _race(tmp_path: Path, env: dict[str, str], workers: int, marker: str) -> list[int]:
    """``workers`` processes compiling one new kernel, all past their miss together: compiles each."""
    log, start = tmp_path / f"log_{marker}.jsonl", tmp_path / f"start_{marker}"
    child = _child(tmp_path, marker)
    ready = [tmp_path / f"ready_{marker}_{i}" for i in range(workers)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(child), str(log), str(start), marker, str(r), str(workers)],
            env=env,
        )
        for r in ready
    ]
    deadline = time.monotonic() + 120
    while not all(r.exists() for r in ready):  # every child has imported Triton and waits
        assert time.monotonic() < deadline, "the children never got ready"
        assert all(p.poll() is None for p in procs), "a child died before the start"
        time.sleep(0.01)
    start.touch()
    for p in procs:
        assert p.wait(timeout=120) == 0
    return [json.loads(line)["compiled"] for line in log.read_text().splitlines()]


def test_worker_env_names_the_manager_unless_off_or_the_users_own() -> None:
    assert worker_env({}) == {VARIABLE: MANAGER}
    assert worker_env({VARIABLE: MANAGER}) == {VARIABLE: MANAGER}
    assert worker_env({"OPGATE_TRITON_SINGLE_FLIGHT": "0"}) == {}
    assert worker_env({"OPGATE_TRITON_SINGLE_FLIGHT": " Off "}) == {}
    assert worker_env({VARIABLE: "mycache:Manager"}) == {}  # the user's own manager is left alone


def test_gpu_and_build_workers_get_it_cpu_workers_do_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(VARIABLE, raising=False)
    config = WorkerConfig(logs=tmp_path)
    assert config.env("cuda", None)[VARIABLE] == MANAGER
    assert config.env("build", None)[VARIABLE] == MANAGER
    assert VARIABLE not in config.env("cpu", None)  # Triton interprets there: nothing to compile


def test_the_parent_never_imports_triton_for_it() -> None:
    code = "import sys, opgate.validators.tritoncache as t; t.worker_env({}); print('triton' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_workers_racing_for_one_kernel_compile_it_once(tmp_path: Path) -> None:
    compiled = _race(tmp_path, _env(tmp_path, **{VARIABLE: MANAGER}), workers=3, marker="single")
    assert sorted(compiled) == [0, 0, 1], compiled


def test_without_it_each_racing_worker_compiles(tmp_path: Path) -> None:
    """The control: Triton's own manager compiles the kernel in every worker that missed."""
    compiled = _race(tmp_path, _env(tmp_path), workers=3, marker="default")
    assert compiled == [1, 1, 1], compiled


def _manager(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key: str) -> object:
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    return tritoncache.SingleFlightCacheManager(key)


def test_a_compile_that_raises_lets_the_next_worker_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing_compile() -> None:
        manager = _manager(tmp_path, monkeypatch, "KEYA")
        assert manager.get_group("k.json") is None  # type: ignore[attr-defined] # this worker compiles...
        raise RuntimeError("compile error in the kernel")  # ...and fails before put_group

    with pytest.raises(RuntimeError):
        failing_compile()
    monkeypatch.setattr(tritoncache, "WAIT_S", 30.0)  # a lock left held would cost all of it
    t0 = time.monotonic()
    other = _manager(tmp_path, monkeypatch, "KEYA")
    assert other.get_group("k.json") is None  # type: ignore[attr-defined]
    assert time.monotonic() - t0 < 15.0  # the lock was free: no wait, however loaded the machine
    other.release()  # type: ignore[attr-defined]


def test_a_wait_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker stuck holding a kernel's lock costs the others WAIT_S, then they compile."""
    holder = _manager(tmp_path, monkeypatch, "KEYB")
    assert holder.get_group("g") is None  # type: ignore[attr-defined]
    assert (tmp_path / "triton" / "KEYB" / LOCK_NAME).exists()
    monkeypatch.setattr(tritoncache, "WAIT_S", 0.3)
    waited_before = tritoncache.WAIT_SECONDS[0]
    t0 = time.monotonic()
    waiter = _manager(tmp_path, monkeypatch, "KEYB")
    assert waiter.get_group("k.json") is None  # type: ignore[attr-defined]
    assert 0.3 <= time.monotonic() - t0 < 2.0
    assert 0.3 <= tritoncache.WAIT_SECONDS[0] - waited_before < 2.0  # the wait is on the books
    holder.release()  # type: ignore[attr-defined]


def test_a_check_records_the_time_it_waited_on_another_workers_compile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The breakdown counts it as waiting, not as the check's compile or kernel work."""
    from opgate.validators.checks.base import Check, always, run_check
    from opgate.validators.result import CheckResult, Verdict

    holder = _manager(tmp_path, monkeypatch, "KEYW")
    assert holder.get_group("g") is None  # type: ignore[attr-defined] # another worker compiles KEYW
    monkeypatch.setattr(tritoncache, "WAIT_S", 0.25)

    def needs_the_kernel(_: object) -> CheckResult:
        waiter = tritoncache.SingleFlightCacheManager("KEYW")
        assert waiter.get_group("g") is None  # gave up after WAIT_S: compiles itself
        time.sleep(0.1)  # its own work
        return CheckResult("compile", Verdict.PASS, "ok")

    def own_work_only(_: object) -> CheckResult:
        time.sleep(0.1)
        return CheckResult("correctness", Verdict.PASS, "ok")

    waited = run_check(Check("compile", always, needs_the_kernel), None)  # type: ignore[arg-type]
    assert 0.25 <= waited.waited_s < waited.duration_s
    assert waited.to_json()["waited_s"] == waited.waited_s
    assert CheckResult.from_json(waited.to_json()).waited_s == waited.waited_s
    plain = run_check(Check("correctness", always, own_work_only), None)  # type: ignore[arg-type]
    assert plain.waited_s == 0.0
    assert "waited_s" not in plain.to_json()  # the record stays as it was
    holder.release()  # type: ignore[attr-defined]


def test_a_waiter_finds_the_kernel_the_holder_wrote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    holder = _manager(tmp_path, monkeypatch, "C")
    assert holder.get_group("g") is None  # type: ignore[attr-defined]
    code = "import opgate.validators.tritoncache as t; print(t.SingleFlightCacheManager('C').get_group('g'))"
    out = subprocess.Popen(
        [sys.executable, "-c", code],
        env={**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "triton")},
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    time.sleep(2.0)  # the other worker waits on the lock
    assert out.poll() is None
    path = holder.put(b"cubin", "k.cubin")  # type: ignore[attr-defined]
    holder.put_group("g", {"k.cubin": path})  # type: ignore[attr-defined]
    stdout, _ = out.communicate(timeout=30)
    assert "k.cubin" in stdout
