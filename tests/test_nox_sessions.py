"""noxfile.py: stable session names, the machine's default for ``-s matrix``, and CI's command.

CI calls sessions by name, so the names must not move between a CPU box and a
GPU box; only which of them ``nox -s matrix`` means may.  The slow tests run
``matrix(torch=installed)`` for real (the test interpreter has torch) and the
README's first command on a Python without nox.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOXFILE = ROOT / "noxfile.py"
PINNED = ["matrix(torch=2.13.0)", "matrix(torch=2.14.1)"]
INSTALLED = "matrix(torch=installed)"
ALL_SESSIONS = {*PINNED, INSTALLED, "tests", "lint", "liger", "bitsandbytes", "wheel"}
CPU_CELL = "rms_norm.triton-*-cpu-fp32-contiguous-eager"
SKIP_CELL = "rms_norm.triton-*-sm_90-fp32-contiguous-eager"


def nox(*args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "nox", "-f", str(NOXFILE), *args]
    return subprocess.run(
        argv,
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **env},
    )


def listed(*args: str, default: str) -> list[dict[str, Any]]:
    done = nox("-l", "--json", *args, OPGATE_MATRIX_DEFAULT=default)
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout))


@pytest.mark.integration
@pytest.mark.parametrize("default", ["pinned", "installed"])
def test_session_names_do_not_depend_on_the_machine(default: str) -> None:
    names = {s["session"] for s in listed("-s", *ALL_SESSIONS, default=default)}
    assert names == ALL_SESSIONS


@pytest.mark.integration
@pytest.mark.parametrize(("default", "expected"), [("pinned", PINNED), ("installed", [INSTALLED])])
def test_dash_s_matrix_is_this_machines_default(default: str, expected: list[str]) -> None:
    assert [s["session"] for s in listed("-s", "matrix", default=default)] == expected


@pytest.mark.integration
def test_plain_nox_runs_lint_and_tests_only() -> None:
    assert sorted(s["session"] for s in listed(default="pinned")) == ["lint", "tests"]


@pytest.mark.integration
def test_torch_pins_reach_the_sessions() -> None:
    specs = {s["session"]: s["call_spec"] for s in listed("-s", "matrix", default="pinned")}
    assert specs == {name: {"torch": name[len("matrix(torch=") : -1]} for name in PINNED}


@pytest.mark.integration
def test_unknown_default_is_refused() -> None:
    done = nox("-l", OPGATE_MATRIX_DEFAULT="gpu")
    assert done.returncode != 0
    assert "OPGATE_MATRIX_DEFAULT='gpu'" in done.stdout + done.stderr


def test_ci_runs_exactly_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    commands = re.findall(r"^(\S*python\S* noxfile\.py -s tests)\b", readme, flags=re.MULTILINE)
    assert commands, "README.md shows no `... noxfile.py -s tests` command"
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    default_python = re.search(r'python_bin="\$\{PYTHON:-(\S+)\}"', ci)
    assert default_python, ".ci/run must default its interpreter"
    assert f"{default_python[1]} noxfile.py -s tests" == commands[0]
    assert '"$python_bin" noxfile.py -s tests' in ci


@pytest.mark.slow
def test_matrix_installed_validates_this_python_and_publishes_every_run(tmp_path: Path) -> None:
    env = {"OPGATE_OUT": str(tmp_path), "OPGATE_PYTHON": sys.executable}
    first = nox("-s", INSTALLED, "--", "--select", CPU_CELL, "--no-progress", timeout=600, **env)
    assert first.returncode == 0, first.stdout + first.stderr
    shutil.copytree(tmp_path / "runs" / "installed", tmp_path / "runs" / "earlier")
    second = nox("-s", INSTALLED, "--", "--select", SKIP_CELL, "--no-progress", timeout=600, **env)
    assert second.returncode == 0, second.stdout + second.stderr
    assert f"--in {tmp_path}/runs/earlier --in {tmp_path}/runs/installed" in second.stderr
    compat = json.loads((tmp_path / "report" / "compat.json").read_text())
    verdicts = {c["id"].split("-", 1)[1]: c["verdict"] for c in compat["cells"]}
    assert sorted(verdicts.values()) == ["pass", "skip"], verdicts


@pytest.mark.slow
def test_noxfile_bootstraps_nox_on_a_bare_python(tmp_path: Path) -> None:
    """The README's command on a Python that has no nox: nox lands in .nox/_bootstrap."""
    for name in ("noxfile.py", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    subprocess.run([sys.executable, "-m", "venv", str(tmp_path / "bare")], check=True, timeout=120)
    bare = tmp_path / "bare" / "bin" / "python"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k not in ("OPGATE_PYTHON", "VIRTUAL_ENV")}
        argv = [str(bare), "noxfile.py", *args]
        return subprocess.run(
            argv, check=False, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env
        )

    listing = run("-l")
    assert listing.returncode == 0, listing.stdout + listing.stderr
    assert (tmp_path / ".nox" / "_bootstrap" / "bin" / "python").exists()
    assert "matrix(torch=installed)" in listing.stdout
    # nox runs in the bootstrap venv, but `installed` still means the Python the user started.
    installed = run("-s", INSTALLED, "--", "--select", CPU_CELL)
    assert installed.returncode != 0
    assert f"{bare} has no torch installed" in installed.stdout + installed.stderr


@functools.cache
def _noxfile() -> Any:
    """noxfile.py as a module, loaded once (a second load re-registers every session)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("opgate_noxfile", NOXFILE)
    assert spec is not None
    assert spec.loader is not None
    noxfile = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(noxfile)
    return noxfile


def test_sessions_install_the_debian_packages_their_tests_need(monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's test command provisions the browser itself (as root, or with passwordless sudo)."""
    noxfile = _noxfile()
    assert noxfile.SYSTEM_PACKAGES["tests"]["chromium"] == "chromium"
    found = {"apt-get": "/usr/bin/apt-get", "sudo": "/usr/bin/sudo"}
    monkeypatch.setattr(shutil, "which", found.get)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    update, install = noxfile.apt_commands(["chromium"])
    assert update == ["apt-get", "update", "-qq"]
    assert install[-2:] == ["--no-install-recommends", "chromium"]
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0))
    assert noxfile.apt_commands(["chromium"])[1][:2] == ["/usr/bin/sudo", "-n"]
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 1))  # sudo asks
    assert noxfile.apt_commands(["chromium"]) is None  # the session then says what to install
    tests_session = (ROOT / "noxfile.py").read_text().split("def tests(", 1)[1].split("\n\n\n", 1)[0]
    assert "provision(session)" in tests_session


def test_strict_mode_counts_the_gates_red_verdicts(tmp_path: Path) -> None:
    """``OPGATE_STRICT=1`` rejects exactly what ``Verdict.is_bad`` rejects (no second list)."""
    noxfile = _noxfile()
    verdicts = ["pass", "fallback", "flaky", "skip", "unsupported", "environment", "fail", "error"]
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"cells": [{"id": f"c-{v}", "verdict": v} for v in verdicts]}))
    assert noxfile.red_cells(results) == ["c-fallback", "c-flaky", "c-fail", "c-error"]
    assert noxfile.red_cells(tmp_path / "missing.json") == []
