"""``opgate init``: a new op folder that validates as generated, in a team's package named ``ops``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from opgate.matrix.json_schemas import SCHEMAS_DIR
from opgate.matrix.spec import load_specs

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]


def _opgate(*argv: str, cwd: Path, timeout: int = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "opgate.reports.cli", *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture
def team_repo(tmp_path: Path) -> Path:
    """A git repository whose own package is named ``ops``."""
    repo = tmp_path / "team"
    (repo / "ops").mkdir(parents=True)
    (repo / "ops" / "__init__.py").write_text("")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    return repo


def test_init_writes_an_op_that_loads_as_the_teams_package(team_repo: Path) -> None:
    proc = _opgate("init", "ops", "--name", "my_op", cwd=team_repo)
    assert proc.returncode == 0, proc.stderr
    assert "opgate run --ops-path ops --select 'my_op.*'" in proc.stdout
    folder = team_repo / "ops" / "my_op"
    assert sorted(p.name for p in folder.iterdir()) == [
        "__init__.py",
        "reference.py",
        "spec.yaml",
        "test_my_op.py",
        "triton_impl.py",
    ]
    spec = load_specs([team_repo / "ops"])["my_op"]
    assert spec.root == team_repo.resolve()
    assert spec.reference == "ops.my_op.reference:my_op"
    impl = spec.implementations["triton"]
    assert impl.qualname == "team::my_op"  # namespace: the repository's folder name
    assert impl.entry == "ops.my_op.triton_impl:my_op"
    text = (folder / "triton_impl.py").read_text()
    assert "@triton_op(OP, mutates_args={})" in text
    assert "wrap_triton(_my_op_kernel)" in text
    assert "register_autograd" in text
    schema_line = (folder / "spec.yaml").read_text().splitlines()[0]
    assert schema_line.startswith("# yaml-language-server: $schema=")
    assert Path(schema_line.split("=", 1)[1]).resolve() == SCHEMAS_DIR / "spec.schema.json"
    listed = _opgate("list", "--ops-path", "ops", "--select", "my_op.*-cpu-*", cwd=team_repo)
    assert listed.returncode == 0, listed.stderr
    assert "my_op.triton-pt2.13-cpu-bf16-transposed-compile" in listed.stdout.split()


def test_init_refuses_what_it_cannot_write(team_repo: Path) -> None:
    assert _opgate("init", "ops", "--name", "my_op", cwd=team_repo).returncode == 0
    for argv, problem in [
        (["--name", "my_op"], "already exists"),
        (["--name", "rms_norm"], "opgate ships an op of that name"),
        (["--name", "My-Op"], "an op name is"),
        (["--name", "class"], "not a Python keyword"),
        (["--name", "other", "--namespace", "Bad-NS"], "torch.library namespace"),
    ]:
        proc = _opgate("init", "ops", *argv, cwd=team_repo)
        assert proc.returncode == 2, (argv, proc.stdout)
        assert problem in proc.stderr
        assert "Traceback" not in proc.stderr
    (team_repo / "kernels").mkdir()  # no __init__.py: each op folder in it is a top-level package
    for name in ("torch", "json"):
        proc = _opgate("init", "kernels", "--name", name, cwd=team_repo)
        assert proc.returncode == 2, proc.stdout
        assert f"the op's package would be {name!r}, which is already a module here" in proc.stderr
        assert not (team_repo / "kernels" / name).exists()
    assert _opgate("init", "kernels", "--name", "fused_gate", cwd=team_repo).returncode == 0


@pytest.mark.slow
def test_generated_files_are_clean_and_their_own_test_passes(team_repo: Path) -> None:
    assert _opgate("init", "ops", "--name", "my_op", cwd=team_repo).returncode == 0
    ruff = shutil.which("ruff")
    assert ruff is not None, "ruff is a test dependency (pyproject [test] extra)"
    config = ["--config", str(ROOT / "pyproject.toml")]
    for command in (["check"], ["format", "--check"]):
        proc = subprocess.run(
            [ruff, *command, *config, "ops"], cwd=team_repo, capture_output=True, text=True, check=False
        )
        assert proc.returncode == 0, proc.stdout
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the test sets it itself
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "ops/my_op"],
        cwd=team_repo,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert tests.returncode == 0, tests.stdout + tests.stderr
    assert "3 passed" in tests.stdout
