"""Every workflow keeps opgate's GPU-gate rules and passes zizmor, and each rule bites.

Two checkers, one contract: zizmor (``.github/zizmor.yml``, the command of
``nox -s lint``) for general Actions hardening, tests/workflow_rules.py for what
only opgate knows (fork PRs and self-hosted GPU runners).  Each planted fault
under tests/data/workflows/ breaks exactly one rule (its first line says which:
``# expect: fork-gate`` or ``# expect: zizmor:template-injection``) and must be
reported by that rule alone; the clean fixture must pass both.  The second half
pins down the data flow of pr.yml, nightly.yml and release.yml, so a refactor
of a workflow cannot quietly drop the gate.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from opgate.reports.alerts.registry import PLATFORMS
from tests.lint_commands import lint_command
from tests.workflow_rules import PR_CONCURRENCY_GROUP, RULES, Workflow, check

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW_DIR = ROOT / ".github" / "workflows"
WORKFLOWS = sorted(WORKFLOW_DIR.glob("*.y*ml"))
FIXTURES = sorted((ROOT / "tests" / "data" / "workflows").glob("*.yml"))
ZIZMOR_CONFIG = ROOT / ".github" / "zizmor.yml"


def zizmor() -> str:
    found = shutil.which("zizmor") or shutil.which("zizmor", path=str(Path(sys.executable).parent))
    assert found, "zizmor is not installed: it comes with the test and lint extras"
    return found


def zizmor_options() -> list[str]:
    """The lint command's options, without its input (``.github``)."""
    return lint_command("zizmor")[1:-1]


@cache
def zizmor_findings() -> dict[str, frozenset[str]]:
    """zizmor's audit ids per fixture file, from one run over all of them (JSON output)."""
    argv = [zizmor(), *zizmor_options(), "--format=json", *map(str, FIXTURES)]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert proc.stdout.strip(), proc.stderr[-2000:]
    found: dict[str, set[str]] = {}
    for finding in json.loads(proc.stdout):
        for loc in finding["locations"]:
            path = Path(loc["symbolic"]["key"]["Local"]["verbatim_path"]).name
            found.setdefault(path, set()).add(f"zizmor:{finding['ident']}")
    return {name: frozenset(ids) for name, ids in found.items()}


def findings(path: Path) -> set[str]:
    return {v.rule for v in check(path)} | set(zizmor_findings().get(path.name, ()))


#: every registered chat platform's URL and signing secret: the nightly's alert step must pass each
SECRETS = tuple(name for p in PLATFORMS.values() for name in (p.url_env, p.secret_env) if name is not None)


def load(name: str) -> Workflow:
    return Workflow.load(WORKFLOW_DIR / name)


def runs(job: dict[str, Any]) -> str:
    return "\n".join(str(step.get("run", "")) for step in job.get("steps", []))


def test_the_workflows_exist() -> None:
    assert {p.name for p in WORKFLOWS} >= {"pr.yml", "nightly.yml", "release.yml", "opgate.yml"}


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_keeps_every_rule(path: Path) -> None:
    violations = check(path)
    assert not violations, "\n".join(map(str, violations))


@pytest.mark.integration
def test_zizmor_passes_on_the_workflows_and_dependabot_config() -> None:
    command = lint_command("zizmor")
    assert command[-1] == ".github"
    proc = subprocess.run(
        [zizmor(), *command[1:]], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    assert "completed .github/dependabot.yml" in proc.stderr


def test_every_deliberate_zizmor_finding_is_explained_in_the_config() -> None:
    """An inline ``# zizmor: ignore[audit]`` is a choice; .github/zizmor.yml says why."""
    config = ZIZMOR_CONFIG.read_text(encoding="utf-8")
    for path in WORKFLOWS:
        for audit in re.findall(r"#\s*zizmor:\s*ignore\[([\w-]+)\]", path.read_text(encoding="utf-8")):
            assert re.search(rf"^#\s+{audit}\s+{path.name}\b", config, re.MULTILINE), (path.name, audit)


@pytest.mark.integration
@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_planted_fault_is_caught_by_its_rule_alone(path: Path) -> None:
    header = path.read_text(encoding="utf-8").splitlines()[0]
    match = re.fullmatch(r"# expect: ((?:zizmor:)?[\w-]+)", header)
    assert match, f"{path}:1: fixtures start with `# expect: <rule>` or `# expect: zizmor:<audit>`"
    expected = set() if match[1] == "none" else {match[1]}
    assert findings(path) == expected
    violations = check(path)
    assert all(re.search(r"\.yml:\d+$", v.where) for v in violations), "violations say file:line"


def test_every_rule_has_a_planted_fault() -> None:
    caught = {v.rule for path in FIXTURES for v in check(path)}
    assert caught == set(RULES)
    assert {"fork-gate", "concurrency", "timeout", "fail-fast"} == set(RULES), "only opgate's own rules"


def test_on_is_a_key_not_yaml11_true() -> None:
    assert load("pr.yml").triggers == {"pull_request"}
    assert load("nightly.yml").triggers == {"schedule", "workflow_dispatch"}
    assert load("release.yml").triggers == {"release"}
    assert load("opgate.yml").triggers == {"workflow_call"}


def test_one_version_of_each_action_everywhere() -> None:
    refs: dict[str, set[str]] = {}
    for path in WORKFLOWS:
        for ref in re.findall(r"uses:\s*([\w./-]+)@([0-9a-f]{40})", path.read_text(encoding="utf-8")):
            refs.setdefault(ref[0], set()).add(ref[1])
    assert refs, "no pinned actions found"
    assert {a: shas for a, shas in refs.items() if len(shas) > 1} == {}


def calls(wf: Workflow) -> dict[str, Any]:
    """The jobs of ``wf`` that call opgate's reusable workflow."""
    return {n: j for n, j in wf.jobs() if j.get("uses") == "./.github/workflows/opgate.yml"}


def test_pr_and_nightly_run_the_one_reusable_flow() -> None:
    declared = load("opgate.yml").data["on"]["workflow_call"]["inputs"]
    required = {k for k, spec in declared.items() if spec.get("required")}
    for name in ("pr.yml", "nightly.yml"):
        (call,) = calls(load(name)).values()
        assert required <= set(call["with"]) <= set(declared), name
        assert call["with"]["opgate-install"] == "-e .", "opgate's own workflows validate the checkout"
        assert call["permissions"] == {"contents": "read", "actions": "read"}
        scripts = "\n".join(runs(job) for _, job in load(name).jobs())
        for command in ("opgate plan", "opgate run", "opgate publish"):
            assert command not in scripts, f"{name} runs the flow through opgate.yml, not a copy of it"


def test_reusable_plan_shards_publish_gate() -> None:
    wf = load("opgate.yml")
    jobs = wf.data["jobs"]
    assert set(jobs) == {"plan", "shards", "publish", "gate"}
    assert "concurrency" not in wf.data, "the caller owns concurrency"

    plan = jobs["plan"]
    assert "opgate plan" in runs(plan)
    assert '"${args[@]}" > plan-matrix.json' in runs(plan)
    assert plan["outputs"]["matrix"] == "${{ steps.plan.outputs.matrix }}"

    shards = jobs["shards"]
    assert shards["strategy"]["matrix"] == "${{ fromJSON(needs.plan.outputs.matrix) }}"
    assert shards["strategy"]["fail-fast"] is False
    assert shards["runs-on"] == "${{ matrix.runs_on }}"
    assert shards["environment"] == "${{ inputs.gpu-environment }}"
    assert wf.data["on"]["workflow_call"]["inputs"]["gpu-environment"]["default"] == "gpu"
    uploads = [s for s in shards["steps"] if str(s.get("uses", "")).startswith("actions/upload-artifact@")]
    assert [u["with"]["name"] for u in uploads] == ["results-${{ matrix.name }}"]
    assert uploads[0]["if"] == "always()", "a shard with red cells still reports"

    publish = jobs["publish"]
    assert "opgate publish --manifest plan/plan-manifest.json" in runs(publish)
    assert publish["if"] == "always() && needs.plan.result == 'success'"

    gate = jobs["gate"]
    assert gate["if"] == "always()"
    assert set(gate["needs"]) == set(jobs) - {"gate"}, "the gate must see every other job"
    gate_runs = runs(gate)
    assert "--fail-on-regression" in gate_runs
    assert "opgate diff --base base/compat.json --head head/compat.json" in gate_runs
    assert "GITHUB_STEP_SUMMARY" in gate_runs
    assert "NEEDS: ${{ toJSON(needs) }}" in (WORKFLOW_DIR / "opgate.yml").read_text(encoding="utf-8")


def test_pr_gate_sees_every_job() -> None:
    wf = load("pr.yml")
    jobs = wf.data["jobs"]
    assert set(jobs) == {"lint", "tests", "matrix", "gate"}
    assert wf.data["concurrency"]["group"] == PR_CONCURRENCY_GROUP
    assert "python noxfile.py -s lint" in runs(jobs["lint"])
    assert "bash .ci/run" in runs(jobs["tests"])
    gate = jobs["gate"]
    assert gate["if"] == "always()"
    assert set(gate["needs"]) == set(jobs) - {"gate"}
    assert "NEEDS: ${{ toJSON(needs) }}" in (WORKFLOW_DIR / "pr.yml").read_text(encoding="utf-8")
    assert calls(wf)["matrix"]["with"]["gpu-environment"] == "gpu"


def test_the_reusable_workflows_fork_gate_bites(tmp_path: Path) -> None:
    """Dropping the label clause or the reviewed default from opgate.yml is caught."""
    text = (WORKFLOW_DIR / "opgate.yml").read_text(encoding="utf-8")
    label = "\n        || contains(github.event.pull_request.labels.*.name, 'gpu-ok'))"
    assert label in text
    for planted in (
        text.replace(label, ")"),
        text.replace("        default: gpu\n", '        default: ""\n'),
    ):
        assert planted != text
        path = tmp_path / "opgate.yml"
        path.write_text(planted, encoding="utf-8")
        assert {v.rule for v in check(path)} == {"fork-gate"}


def test_nightly_runs_everything_and_alerts_with_every_secret_through_env() -> None:
    wf = load("nightly.yml")
    assert wf.data["on"]["schedule"][0]["cron"]
    jobs = wf.data["jobs"]
    assert set(jobs) == {"matrix", "pages", "alert"}
    assert calls(wf)["matrix"]["with"]["pages"] is True
    assert calls(wf)["matrix"]["with"]["gpu-environment"] == "gpu-scheduled"
    alert = next(s for s in jobs["alert"]["steps"] if "opgate alert" in str(s.get("run", "")))
    assert alert["continue-on-error"] is True, "a failed alert never turns the matrix red"
    assert {name: alert["env"].get(name) for name in SECRETS} == {
        name: f"${{{{ secrets.{name} }}}}" for name in SECRETS
    }
    text = (WORKFLOW_DIR / "nightly.yml").read_text(encoding="utf-8")
    assert len(re.findall(r"secrets\.OPGATE_", text)) == len(SECRETS), "secrets go to the alert step only"


def test_release_uploads_the_table_and_opens_a_docs_pr() -> None:
    wf = load("release.yml")
    assert wf.data["on"] == {"release": {"types": ["published"]}}
    jobs = wf.data["jobs"]
    assert "gh release upload" in runs(jobs["asset"])
    assert jobs["asset"]["permissions"]["contents"] == "write"
    assert "gh pr create" in runs(jobs["docs"])
    assert "TAG: ${{ github.event.release.tag_name }}" in (WORKFLOW_DIR / "release.yml").read_text(
        encoding="utf-8"
    )
