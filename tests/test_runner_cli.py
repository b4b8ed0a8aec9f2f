"""``opgate run``: what this machine skips, what it leaves out, and exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from junitparser import JUnitXml

from opgate.matrix.errors import ConfigError, SelectionEmpty, UsageError
from opgate.validators import bytecode
from opgate.validators.result import RunResults, Verdict

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "fixtures_runner"
CONFIG = FIXTURES / "matrix.yaml"


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPGATE_CACHE", str(tmp_path / "cache"))


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "opgate.validators", "run", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},  # this test is about a machine with no GPU
        check=False,
    )


def test_gpu_cells_skip_here_and_other_torch_cells_are_left_out(tmp_path: Path) -> None:
    proc = run(
        "--config",
        str(CONFIG),
        "--ops-path",
        str(FIXTURES),
        "--select",
        "fx_*-sm_90-*",
        "--out",
        str(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr  # skips are not failures
    results = RunResults.read(tmp_path / "results.json")
    # 3 ops x 3 dtypes + fx_killed (bf16 only) + fx_segv.needs_dist x 3, of the installed torch only
    assert len(results.cells) == 13
    assert {c.verdict for c in results.cells} == {Verdict.SKIP}
    native = [c for c in results.cells if c.cell.impl == "native"]
    assert {c.reason for c in native} == {"no sm_90 device here"}
    assert all(c.cell.torch != "2.99.0" for c in results.cells)
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["other_torch_cells"] == 13  # the 2.99 column: another session's job
    assert record["workers"] == []  # nothing to run: no worker was started
    # the same interpreter decides the same: a bytecode cache only where it keeps none
    assert record["bytecode_cache"] == bytecode.decide(dict(os.environ)).to_json()
    assert "13 cells of another torch version left out" in proc.stdout
    assert results.env["env_key"].startswith("pt")
    assert results.env["gpus"] == []
    xml = JUnitXml.fromfile(str(tmp_path / "junit.xml"))
    assert (xml.tests, xml.skipped, xml.failures, xml.errors) == (13, 13, 0, 0)


def test_bad_config_is_one_line_with_its_exit_code(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(CONFIG.read_text().replace("dtype: [", "dtpye: ["))
    proc = run("--config", str(bad), "--ops-path", str(FIXTURES), "--out", str(tmp_path / "out"))
    assert proc.returncode == ConfigError.exit_code
    assert "Traceback" not in proc.stderr
    assert f"{bad}:" in proc.stderr
    assert "dtpye" in proc.stderr
    assert not (tmp_path / "out" / "results.json").exists()


def test_empty_selection_has_its_exit_code(tmp_path: Path) -> None:
    proc = run(
        "--config", str(CONFIG), "--ops-path", str(FIXTURES), "--select", "nope*", "--out", str(tmp_path)
    )
    assert proc.returncode == SelectionEmpty.exit_code
    assert "Traceback" not in proc.stderr
    assert "nope*" in proc.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["--select", "x"],  # no --out
        ["--out", "o", "--jobs", "0"],
        ["--out", "o", "--timeout", "-1"],
        ["--out", "o", "--ops-path", "/no/such/dir"],
    ],
)
def test_usage_errors(args: list[str]) -> None:
    proc = run(*args)
    assert proc.returncode == UsageError.exit_code, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr
