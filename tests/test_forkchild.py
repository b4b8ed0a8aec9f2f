"""Build cells' compile children forked from the preloaded worker: isolated, and only when it is safe.

A fork stands in for a fresh interpreter only if the modules were imported
under the same import-sensitive environment: Triton imported under
``TRITON_INTERPRET=1`` decorates its own library for the interpreter, and a
cross-compile forked from such a process fails (the planted case below).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from opgate.validators import forkchild

TARGETS = "tests.fixtures_runner.fork_targets"
ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.integration
def test_a_forked_child_runs_in_its_own_session_with_its_own_environment() -> None:
    result, _ = forkchild.call_forked(
        f"{TARGETS}:echo", json.dumps([1, 2]), {**os.environ, "FORK_TEST": "x"}, 30
    )
    assert result is not None
    assert result["arg"] == [1, 2]
    assert result["env"] == "x"
    assert result["pid"] != os.getpid()
    assert result["sid"] == result["pid"]  # setsid: a kill of its group takes what it started
    assert os.environ.get("FORK_TEST") is None  # the parent's environment is untouched


@pytest.mark.integration
def test_a_crash_or_a_hang_costs_the_child_only() -> None:
    result, tail = forkchild.call_forked(f"{TARGETS}:crash", "{}", dict(os.environ), 30)
    assert result is None
    assert "killed by SIGSEGV" in tail
    result, tail = forkchild.call_forked(f"{TARGETS}:hang", "{}", dict(os.environ), 0.5)
    assert result is None
    assert "timed out after 0.5 s" in tail


PROBE = """
import json, os, sys, tempfile
from opgate.validators import forkchild
from opgate.validators.checks.build import _cross_compile
from opgate.validators.worker import preload

preload([], sys.argv[1])
env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
env["TRITON_CACHE_DIR"] = tempfile.mkdtemp()  # a real compile, not a cache hit
out = tempfile.mkdtemp()
request = {"module": "opgate.ops.rope.triton_impl", "arch": "sm_90", "dtypes": ["fp32"],
           "signatures": None, "outdir": out, "launches": None}
forks = forkchild.can_fork(("torch", "triton"), env)
report = _cross_compile(request, env)
print(json.dumps({"forks": forks, "kernels": report.get("kernels"), "stderr": report.get("stderr")}))
"""


@pytest.mark.slow
@pytest.mark.parametrize(("interpret", "forks"), [("1", False), ("", True)])
def test_cross_compile_forks_only_from_a_triton_imported_for_gpus(interpret: str, forks: bool) -> None:
    env = {**os.environ, "TRITON_INTERPRET": interpret, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(PROBE), "build"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["forks"] is forks
    assert report["stderr"] is None
    assert [k.get("error") for k in report["kernels"]] == [None]  # a cubin, fork or not
    assert Path(report["kernels"][0]["cubin"]).stat().st_size > 0


def test_forking_needs_a_recorded_import_environment_that_matches(monkeypatch: pytest.MonkeyPatch) -> None:
    # one thread, as in a worker; a test process may hold others (xdist, servers of earlier tests)
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    monkeypatch.setattr(forkchild, "_imported_under", None)
    assert not forkchild.can_fork((), {})  # a process opgate did not preload: never
    monkeypatch.setattr(forkchild, "_imported_under", {"TRITON_INTERPRET": "1"})
    assert not forkchild.can_fork((), {})  # imported for the interpreter, the child compiles for GPUs
    assert forkchild.can_fork((), {"TRITON_INTERPRET": "1"})
    assert not forkchild.can_fork(("no_such_module_imported",), {"TRITON_INTERPRET": "1"})
    monkeypatch.setattr(threading, "active_count", lambda: 2)
    assert not forkchild.can_fork((), {"TRITON_INTERPRET": "1"})  # a second thread: never fork
