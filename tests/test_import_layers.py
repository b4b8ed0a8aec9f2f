"""The import contracts of ``nox -s lint`` hold on opgate and fire on a planted violation.

Data flows one way, matrix -> validators -> reports, and ``ops/`` (the payload
under test) imports none of the stages: ``[tool.importlinter]`` in
pyproject.toml says so and ``lint-imports`` checks it.  The planted trees are
tiny ``opgate`` namespace packages checked against the very same contracts, so
a contract that stopped matching anything (a renamed package) turns this red.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

pytest.importorskip("importlinter", reason="import-linter is in the test and lint extras")

ROOT = Path(__file__).resolve().parents[1]
CHECKOUT = ROOT / ".nox" / "_checkout"
STAGES = ("matrix", "validators", "reports", "ops")


def lint_imports(config: Path, pythonpath: Path) -> subprocess.CompletedProcess[str]:
    # `lint-imports` is this entry point; called through the interpreter, so no PATH lookup
    cli = "from importlinter.cli import lint_imports_command; lint_imports_command()"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(pythonpath), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-c", cli, "--no-cache", "--no-logo", str(config)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
        cwd=config.parent,
    )


def planted(tmp_path: Path, imports: dict[str, str]) -> Path:
    """An ``opgate`` namespace with the four stages, ``imports`` (stage -> import line) planted."""
    root = tmp_path / "site"
    for stage in STAGES:
        folder = root / "opgate" / stage
        folder.mkdir(parents=True)
        (folder / "__init__.py").write_text("")
        (folder / "core.py").write_text(imports.get(stage, "") + "\n")
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    return root


def test_opgate_keeps_its_layers() -> None:
    out = lint_imports(ROOT / "pyproject.toml", CHECKOUT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 kept, 0 broken" in out.stdout


def test_the_allowed_direction_passes(tmp_path: Path) -> None:
    root = planted(
        tmp_path,
        {
            "reports": "from opgate.validators import core",
            "validators": "from opgate.matrix import core",
            "matrix": "from opgate.ops import core",
        },
    )
    out = lint_imports(root / "pyproject.toml", root)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize(
    ("stage", "line", "contract"),
    [
        ("matrix", "from opgate.validators import core", "stages"),
        ("validators", "from opgate.reports import core", "stages"),
        ("ops", "from opgate.matrix import core", "ops is the payload"),
        ("ops", "import opgate.validators.core", "ops is the payload"),
    ],
)
def test_an_import_against_the_flow_is_refused(tmp_path: Path, stage: str, line: str, contract: str) -> None:
    root = planted(tmp_path, {stage: line})
    out = lint_imports(root / "pyproject.toml", root)
    assert out.returncode == 1, out.stdout + out.stderr
    broken = [row for row in out.stdout.splitlines() if row.endswith("BROKEN")]
    assert len(broken) == 1, out.stdout
    assert broken[0].startswith(contract), out.stdout
    assert f"opgate.{stage}.core" in out.stdout
