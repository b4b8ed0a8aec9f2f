"""The workflows read exactly what ``opgate plan`` writes.

GitHub only finds out at run time that a shard job reads ``matrix.runs-on``
when the plan says ``runs_on``, or that publish looks for a manifest the plan
job never wrote.  These tests run the real plan command and hold every
workflow's shard job and artifact names against its output.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.workflow_rules import Workflow

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
SHARDED = ("opgate.yml",)  # pr.yml and nightly.yml run its jobs (test_workflows_hardening)


def steps_text(job: dict[str, Any]) -> str:
    return json.dumps(job)


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    manifest = tmp_path_factory.mktemp("plan") / "plan-manifest.json"
    argv = [
        sys.executable,
        "-m",
        "opgate.matrix",
        "plan",
        "--format",
        "gha",
        "--max-jobs",
        "64",
        "--torch",
        "2.13.0",
    ]
    done = subprocess.run(
        [*argv, "--manifest", str(manifest)],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return {"gha": json.loads(done.stdout), "manifest": json.loads(manifest.read_text())}


@pytest.mark.parametrize("name", SHARDED)
def test_shard_job_reads_only_keys_the_plan_writes(plan: dict[str, Any], name: str) -> None:
    shards = Workflow.load(ROOT / ".github" / "workflows" / name).data["jobs"]["shards"]
    used = set(re.findall(r"\bmatrix\.([A-Za-z_][\w-]*)", steps_text(shards)))
    keys = {key for entry in plan["gha"]["include"] for key in entry}
    assert used, "the shard job reads nothing from its matrix entry"
    assert used <= keys, f"{name} reads matrix.{sorted(used - keys)}; the plan writes {sorted(keys)}"


def test_self_hosted_marks_exactly_the_gpu_shards(plan: dict[str, Any]) -> None:
    """The shard job sets up Python only where `self-hosted` is absent from runs_on."""
    for entry in plan["gha"]["include"]:
        gpu = entry["cuda"] != "none"
        assert ("self-hosted" in entry["runs_on"]) == gpu, entry["name"]


@pytest.mark.parametrize("name", SHARDED)
def test_manifest_travels_from_plan_to_publish(plan: dict[str, Any], name: str) -> None:
    jobs = Workflow.load(ROOT / ".github" / "workflows" / name).data["jobs"]
    plan_job, publish = json.dumps(jobs["plan"]), json.dumps(jobs["publish"])
    assert "--manifest plan-manifest.json" in plan_job
    assert '"name": "plan-manifest", "path": "plan-manifest.json"' in plan_job
    assert '"name": "plan-manifest", "path": "plan"' in publish
    assert "--manifest plan/plan-manifest.json" in publish
    assert '"pattern": "results-*", "path": "shards"' in publish
    assert '"name": "results-${{ matrix.name }}"' in json.dumps(jobs["shards"])
    assert plan["manifest"]["cells"] == sum(e["cells"] for e in plan["gha"]["include"])


def test_plan_fits_a_job_output(plan: dict[str, Any]) -> None:
    text = json.dumps(plan["gha"], separators=(",", ":"))
    assert len(text.encode()) < 1_000_000
    assert len(plan["gha"]["include"]) <= 256
    names = [e["name"] for e in plan["gha"]["include"]]
    assert len(names) == len(set(names)), "artifact names results-<name> must be unique"
