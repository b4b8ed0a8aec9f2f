"""``opgate list``: fast, torch-free, and clear about bad input."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from opgate.matrix.cell import AXES

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).parent / "data" / "config"
OPS = DATA / "ops"
SMALL = ["--config", str(DATA / "two_ops.yaml"), "--ops-path", str(OPS), "--torch", "2.13.0"]


def run(*args: str, importtime: bool = False) -> tuple[subprocess.CompletedProcess[str], float]:
    flags = ["-X", "importtime"] if importtime else []
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, *flags, "-m", "opgate.matrix", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return proc, time.perf_counter() - start


def imported_modules(stderr: str) -> set[str]:
    """Module names from ``-X importtime`` lines (``import time: self | cumulative | name``)."""
    return {
        line.rsplit("|", 1)[1].strip()
        for line in stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }


def test_list_never_imports_torch_and_is_fast() -> None:
    proc, wall = run("list", importtime=True)
    assert proc.returncode == 0, proc.stderr
    mods = imported_modules(proc.stderr)
    assert "yaml" in mods  # the probe works: it sees what list does import
    assert "opgate.matrix.expand" in mods
    heavy = sorted(m for m in mods if m.split(".")[0] in {"torch", "triton", "numpy"})
    assert heavy == []
    assert wall < 2.0, f"opgate list took {wall:.2f} s"


def test_list_prints_one_id_per_line_and_json_agrees() -> None:
    plain, _ = run("list", *SMALL)
    assert plain.returncode == 0, plain.stderr
    lines = plain.stdout.splitlines()
    assert "toy.tri-pt2.13-cu13.0-sm_90-all-all-build" in lines
    assert "flat.ext-pt2.13-cpu-fp32-contiguous-eager" in lines
    as_json, _ = run("list", *SMALL, "--json")
    records = json.loads(as_json.stdout)
    assert [r["id"] for r in records] == lines
    assert set(AXES) <= set(records[0])
    tuned = next(r for r in records if r["id"] == "toy.tri-pt2.13-cpu-fp16-contiguous-compile")
    assert tuned["overrides"] == {"timeout_s": 120.0, "tolerance": {"k": 3.0, "atol_floor": 0.001}}


def test_list_select_and_skip() -> None:
    proc, _ = run("list", *SMALL, "--select", "toy.cu-*", "--select", "flat.*", "--skip", "*-build")
    assert proc.stdout.splitlines() == [
        "flat.ext-pt2.13-cpu-fp32-contiguous-eager",
        "flat.ext-pt2.13-cu13.0-sm_90-fp32-contiguous-eager",
        "toy.cu-pt2.13-cpu-fp32-contiguous-eager",
        "toy.cu-pt2.13-cpu-fp32-transposed-eager",
        "toy.cu-pt2.13-cu13.0-sm_90-fp32-contiguous-eager",
        "toy.cu-pt2.13-cu13.0-sm_90-fp32-transposed-eager",
    ]


def test_config_error_exit_code_and_file_line() -> None:
    bad = DATA / "bad_enum.yaml"
    proc, _ = run("list", "--config", str(bad), "--ops-path", str(OPS))
    assert proc.returncode == 3
    assert proc.stdout == ""
    assert proc.stderr.strip() == f"{bad}:8: dtype[1]: unknown dtype 'bf61' (did you mean 'bf16'?)"
    assert "Traceback" not in proc.stderr


def test_empty_selection_and_bad_ops_path_exit_codes(tmp_path: Path) -> None:
    empty, _ = run("list", *SMALL, "--select", "nothing-*")
    assert empty.returncode == 4
    assert "no cell left" in empty.stderr
    missing, _ = run("list", "--ops-path", str(tmp_path / "absent"))
    assert missing.returncode == 2
    assert "not a directory" in missing.stderr


def test_several_torch_versions_plan_one_shard_set_each() -> None:
    """A CI plan for two torch releases (the reusable workflow's `torch` input): ids carry the version."""
    select = ["--select", "rms_norm.triton-*-cpu-fp32-contiguous-eager"]
    listed, _ = run("list", "--torch", "2.13.0", "--torch", "2.14.1", *select)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split() == [
        "rms_norm.triton-pt2.13-cpu-fp32-contiguous-eager",
        "rms_norm.triton-pt2.14-cpu-fp32-contiguous-eager",
    ]
    planned, _ = run("plan", "--torch", "2.13.0", "--torch", "2.14.1", *select)
    assert planned.returncode == 0, planned.stderr
    assert sorted(s["torch"] for s in json.loads(planned.stdout)["include"]) == ["2.13.0", "2.14.1"]


def test_runner_labels_from_the_command_line_replace_the_matrix_files() -> None:
    select = ["--torch", "2.13.0", "--select", "rms_norm.triton-*-fp32-contiguous-eager"]
    planned, _ = run("plan", *select, "--runner", "sm_90=self-hosted, h100-pool", "--runner", "cpu=my-cpu")
    assert planned.returncode == 0, planned.stderr
    labels = {s["name"].split("-")[0]: s["runs_on"] for s in json.loads(planned.stdout)["include"]}
    assert labels["sm_90"] == ["self-hosted", "h100-pool"]
    assert labels["cpu"] == ["my-cpu"]
    assert labels["sm_80"] == ["self-hosted", "linux", "x64", "gpu-sm80"]  # matrix/default.yaml's
    for bad in ("sm_99=x", "sm_90=", "sm_90=a b", "nolabels"):
        refused, _ = run("plan", *select, "--runner", bad)
        assert refused.returncode == 2, bad
        assert refused.stderr.count("\n") == 1
        assert "ARCH=LABEL" in refused.stderr
