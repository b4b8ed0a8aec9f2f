"""A run's bytecode cache: made only where the interpreter keeps none, and used by child processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from opgate.validators import bytecode


def _package(tmp_path: Path) -> Path:
    """A package standing in for torch: sources only, no bytecode beside them."""
    pkg = tmp_path / "site" / "torchlike"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("from torchlike import heavy\n")
    (pkg / "heavy.py").write_text("VALUE = sum(range(10))\n")
    return pkg / "__init__.py"


@pytest.mark.integration
def test_writes_off_and_no_bytecode_gives_children_a_prefix_they_use(tmp_path: Path) -> None:
    init = _package(tmp_path)
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONPATH": str(init.parent.parent),
        "XDG_CACHE_HOME": str(tmp_path / "xdg"),
    }
    decision = bytecode.apply(env, package_init=lambda _name: init)
    folder = tmp_path / "xdg" / "opgate" / "bytecode"
    assert decision.folder == folder
    assert env["PYTHONPYCACHEPREFIX"] == str(folder)
    assert env["PYTHONDONTWRITEBYTECODE"] == ""

    def import_it() -> str:
        proc = subprocess.run(
            [sys.executable, "-v", "-c", "import torchlike; assert torchlike.heavy.VALUE == 45"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        return proc.stderr

    import_it()
    tag = sys.implementation.cache_tag
    written = folder / str(init.parent).lstrip("/") / f"heavy.{tag}.pyc"
    assert written.is_file()  # under opgate's prefix ...
    assert not (init.parent / "__pycache__").exists()  # ... and never beside the image's sources
    assert f"code object from '{written}'" in import_it()  # the next process loads it

    # the same interpreter with the flag as the image sets it: nothing is cached, ever
    env_off = {**env, "PYTHONDONTWRITEBYTECODE": "1"}
    del env_off["PYTHONPYCACHEPREFIX"]
    subprocess.run([sys.executable, "-c", "import torchlike"], env=env_off, check=True)
    assert not (init.parent / "__pycache__").exists()


@pytest.mark.integration
def test_changed_source_is_recompiled_not_misread(tmp_path: Path) -> None:
    init = _package(tmp_path)
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONDONTWRITEBYTECODE": "1"}
    env["PYTHONPATH"] = str(init.parent.parent)
    env[bytecode.VARIABLE] = str(tmp_path / "bc")
    assert bytecode.apply(env, package_init=lambda _name: init).folder == tmp_path / "bc"
    code = "import torchlike; print(torchlike.heavy.VALUE)"
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    (init.parent / "heavy.py").write_text("VALUE = 'changed, and longer than before'\n")
    second = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert (first.stdout.strip(), second.stdout.strip()) == ("45", "changed, and longer than before")


@pytest.mark.parametrize(
    ("environ", "beside", "writes_off", "expect"),
    [
        ({}, False, True, "PYTHONDONTWRITEBYTECODE is set and no bytecode is installed"),
        ({}, True, True, "bytecode is installed"),
        ({}, False, False, "the interpreter writes bytecode beside the sources"),
        ({"PYTHONPYCACHEPREFIX": "/x"}, False, True, "the user's bytecode cache"),
        ({bytecode.VARIABLE: "off"}, False, True, "OPGATE_BYTECODE_CACHE=off"),
    ],
)
def test_decide(tmp_path: Path, environ: dict[str, str], beside: bool, writes_off: bool, expect: str) -> None:
    init = _package(tmp_path)
    if beside:
        (init.parent / "__pycache__").mkdir()
        (init.parent / "__pycache__" / f"__init__.{sys.implementation.cache_tag}.pyc").write_bytes(b"")
    decision = bytecode.decide(dict(environ), writes_off=writes_off, package_init=lambda _name: init)
    assert expect in decision.reason
    wants = expect.startswith("PYTHONDONTWRITEBYTECODE")
    assert (decision.folder is not None) == wants


def test_read_only_install_without_bytecode_gets_a_prefix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    init = _package(tmp_path)
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == init.parent else real(p, mode))
    decision = bytecode.decide({}, writes_off=False, package_init=lambda _name: init)
    assert decision.folder is not None
    assert "read-only" in decision.reason


def test_no_package_and_unmakeable_folder_leave_the_interpreter_alone(tmp_path: Path) -> None:
    assert bytecode.decide({}, writes_off=True, package_init=lambda _name: None).folder is None
    blocker = tmp_path / "file"
    blocker.write_text("")
    env = {bytecode.VARIABLE: str(blocker / "sub"), "PYTHONDONTWRITEBYTECODE": "1"}
    init = _package(tmp_path)
    decision = bytecode.apply(env, package_init=lambda _name: init)
    assert decision.folder is None
    assert "not made" in decision.reason
    assert "PYTHONPYCACHEPREFIX" not in env
