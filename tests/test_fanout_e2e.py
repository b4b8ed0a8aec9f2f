"""The reusable workflow's flow, end to end, as another team's repository calls it, without GitHub.

``.github/workflows/opgate.yml`` (what pr.yml, nightly.yml and the README's
example caller all run) is executed job by job on this machine by
tests/workflow_local.py: its own ``run:`` scripts, its ``if:`` conditions,
the matrix fan-out of the real plan, artifacts as folders.  The caller is a
temporary repository of a team's own: its ops under ``kernels/`` (a correct
Triton RMSNorm and its package), its matrix file, and the inputs of the
README's example workflow.  What the gate exists for is then shown on it:
the flow goes green, a fork pull request without ``gpu-ok`` gets a red gate
with no shard run and nothing published, a planted kernel bug turns the gate
red against the previous report while a fix does not.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
from pathlib import Path
from typing import Any

import pytest
import yaml

from opgate.matrix import installed_torch
from tests.workflow_local import JobRun, LocalRunner
from tests.workflow_rules import check

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "opgate.yml"
ZOO = ROOT / "tests" / "zoo"
#: Installing opgate from an index cannot happen offline; this interpreter already has it.
SKIPPED = ("Install opgate*",)
MATRIX = """\
matrix_version: 1
ops: [zoo_good]
implementations: ["*"]
torch: [installed]
cuda: ["13.0"]
arch: [cpu, sm_90]
dtype: [fp32]
layout: [contiguous, transposed]
mode: [eager]
shapes: [default]
runners:
  cpu: [ubuntu-latest]
  sm_90: [self-hosted, linux, x64, gpu-sm90]
"""
GH = """\
#!/bin/sh
# GitHub's CLI for the gate's baseline fetch: `run list` names the baseline run when there is
# one, `run download` copies it.  Every call is logged for the test to read.
echo "$*" >> "$OPGATE_TEST_GH_LOG"
case "$1 $2" in
  "run list") [ -d "$OPGATE_TEST_BASELINE" ] && echo 4242; exit 0 ;;
  "run download") shift 2; while [ $# -gt 0 ]; do [ "$1" = --dir ] && dir=$2; shift; done
                  cp -r "$OPGATE_TEST_BASELINE" "$dir" ;;
  *) echo "gh: $*: not played by this test" >&2; exit 2 ;;
esac
"""
pytestmark = pytest.mark.slow


def readme_example() -> dict[str, Any]:
    """The example caller workflow of the README, as YAML."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    match = re.search(
        r"```yaml\n(# \.github/workflows/opgate\.yml in your repository\n.*?)```", text, re.DOTALL
    )
    assert match, "README: the example caller workflow is gone"
    data: dict[str, Any] = yaml.safe_load(match[1].replace("\non:", '\n"on":'))
    return data


def caller_repository(root: Path) -> Path:
    """A team's repository: kernels/<op>/spec.yaml + its package, and its matrix file."""
    repo = root / "caller"
    shutil.copytree(ZOO / "good", repo / "kernels" / "good")
    shutil.copytree(
        ZOO / "zoo_ops", repo / "kernels" / "zoo_ops", ignore=shutil.ignore_patterns("__pycache__")
    )
    (repo / ".github").mkdir(parents=True)
    (repo / ".github" / "opgate-matrix.yaml").write_text(MATRIX)
    return repo


def pull_request(head_repo: str = "team/kernels", labels: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "event_name": "pull_request",
        "repository": "team/kernels",
        "base_ref": "main",
        "token": "token-not-used",
        "event": {
            "pull_request": {
                "head": {"repo": {"full_name": head_repo}},
                "labels": [{"name": n} for n in labels],
            }
        },
    }


def run_flow(
    work: Path, github: dict[str, Any], baseline: Path | None = None
) -> tuple[dict[str, JobRun], Path]:
    """Run opgate.yml with the README example's inputs in a fresh copy of ``work/caller``."""
    attempt = work / f"run{len(list(work.glob('run*')))}"
    workspace = attempt / "workspace"
    shutil.copytree(work / "caller", workspace)
    bin_dir = attempt / "bin"
    bin_dir.mkdir()
    (bin_dir / "gh").write_text(GH)
    (bin_dir / "gh").chmod((bin_dir / "gh").stat().st_mode | stat.S_IXUSR)
    (job,) = readme_example()["jobs"].values()
    inputs = {**job["with"], "torch": installed_torch().split("+")[0]}
    runner = LocalRunner(
        WORKFLOW,
        workspace,
        inputs,
        github,
        skip=SKIPPED,
        env={
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "OPGATE_TEST_BASELINE": str(baseline or attempt / "no-baseline"),
            "OPGATE_TEST_GH_LOG": str(attempt / "gh.log"),
            "OPGATE_CACHE": str(work / "verdict-cache"),
        },
    )
    return runner.run(), attempt


def verdicts(compat: Path) -> dict[str, str]:
    return {c["id"]: c["verdict"] for c in json.loads(compat.read_text())["cells"]}


def logs(jobs: dict[str, JobRun]) -> str:
    return "\n".join(f"== {name}: {job.result}\n" + "\n".join(job.logs) for name, job in jobs.items())


@pytest.fixture(scope="module")
def green(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The README example on a same-repository pull request, no baseline published yet."""
    work = tmp_path_factory.mktemp("fanout")
    caller_repository(work)
    jobs, attempt = run_flow(work, pull_request())
    return {"work": work, "jobs": jobs, "attempt": attempt}


def test_the_readme_example_is_a_clean_caller(tmp_path: Path) -> None:
    path = tmp_path / "caller.yml"
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    path.write_text(
        text.split("# .github/workflows/opgate.yml in your repository\n", 1)[1].split("```", 1)[0]
    )
    assert check(path) == [], "the example keeps opgate's own hardening rules"
    (job,) = readme_example()["jobs"].values()
    declared = yaml.safe_load(WORKFLOW.read_text())[True]["workflow_call"]["inputs"]
    assert set(job["with"]) <= set(declared)
    assert {k for k, spec in declared.items() if spec.get("required")} <= set(job["with"])


def test_a_teams_repository_goes_green_through_plan_shards_publish_gate(green: dict[str, Any]) -> None:
    jobs, attempt = green["jobs"], green["attempt"]
    assert {n: j.result for n, j in jobs.items()} == dict.fromkeys(
        ("plan", "shards", "publish", "gate"), "success"
    ), logs(jobs)
    assert set(jobs["plan"].skipped_steps + jobs["gate"].skipped_steps) == {
        "Install opgate (planning reads YAML only, no torch)",
        "Install opgate (reports need no torch)",
    }
    plan = json.loads(jobs["plan"].outputs["matrix"])["include"]
    labels = {tuple(s["runs_on"]) for s in plan}
    # the example's `runners:` input replaced the matrix file's sm_90 labels; cpu kept its own
    assert labels == {("ubuntu-latest",), ("self-hosted", "linux", "x64", "gpu-h100")}
    artifacts = attempt / "artifacts"
    assert sorted(p.name for p in artifacts.iterdir()) == sorted(
        ["plan-manifest", "compat-report", *(f"results-{s['name']}" for s in plan)]
    )
    got = verdicts(artifacts / "compat-report" / "compat.json")
    torch_mm = "pt" + ".".join(installed_torch().split(".")[:2])
    assert got == {
        f"zoo_good.triton-{torch_mm}-cpu-fp32-contiguous-eager": "pass",
        f"zoo_good.triton-{torch_mm}-cpu-fp32-transposed-eager": "pass",
        f"zoo_good.triton-{torch_mm}-cu13.0-sm_90-fp32-contiguous-eager": "skip",
        f"zoo_good.triton-{torch_mm}-cu13.0-sm_90-fp32-transposed-eager": "skip",
    }
    assert (artifacts / "compat-report" / "index.html").stat().st_size < 200_000
    # no baseline yet: the gate asked for one, found none, and said so
    assert "--workflow nightly.yml --branch main" in (attempt / "gh.log").read_text()
    summary = (attempt / "step_summary").read_text()
    assert "No published matrix on `main` yet: nothing to regress against." in summary
    assert "| shards | success |" in summary


def test_a_fork_without_gpu_ok_runs_no_shard_and_gets_a_red_gate(green: dict[str, Any]) -> None:
    jobs, attempt = run_flow(green["work"], pull_request(head_repo="stranger/kernels"))
    assert {n: j.result for n, j in jobs.items()} == {
        "plan": "success",
        "shards": "skipped",
        "publish": "failure",  # refused: the planned shards did not report
        "gate": "failure",
    }, logs(jobs)
    assert "refusing to publish" in "\n".join(jobs["publish"].logs)
    assert "compat-report" not in {p.name for p in (attempt / "artifacts").iterdir()}
    assert "Fork PRs need the `gpu-ok` label" in (attempt / "step_summary").read_text()

    # a maintainer's label lets the same fork through (the environment's reviewers are GitHub's part)
    labelled, _ = run_flow(green["work"], pull_request(head_repo="stranger/kernels", labels=("gpu-ok",)))
    assert labelled["shards"].result == "success", logs(labelled)


def test_the_gate_passes_a_fix_and_fails_a_planted_kernel_bug(green: dict[str, Any]) -> None:
    work = green["work"]
    report = green["attempt"] / "artifacts" / "compat-report"
    cell = next(c for c, v in verdicts(report / "compat.json").items() if v == "pass")

    # The base branch had the cell red; this PR fixed it: a fix is not a regression.
    base = work / "baseline-red"
    shutil.copytree(report, base)
    doc = json.loads((base / "compat.json").read_text())
    next(c for c in doc["cells"] if c["id"] == cell).update(verdict="fail", reason="planted red baseline")
    (base / "compat.json").write_text(json.dumps(doc))
    fixed, attempt = run_flow(work, pull_request(), baseline=base)
    assert fixed["gate"].result == "success", logs(fixed)
    assert "Fixed" in (attempt / "step_summary").read_text()

    # The PR breaks the kernel (a wrong scale): both CPU cells fail, the gate goes red, naming them.
    good = work / "caller" / "kernels" / "zoo_ops" / "good.py"
    original = good.read_text()
    good.write_text(original.replace("return launch(x, w, eps)", "return launch(x, w, eps) * 1.01"))
    try:
        broken, attempt = run_flow(work, pull_request(), baseline=report)
    finally:
        good.write_text(original)
    assert broken["publish"].result == "success", logs(broken)
    assert broken["gate"].result == "failure"
    summary = (attempt / "step_summary").read_text()
    assert "New failures **2**" in summary
    assert cell in summary
