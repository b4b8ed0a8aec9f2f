"""Every workflow under .github/workflows keeps every hardening rule, and each rule bites.

The rules live in tests/workflow_rules.py.  Each planted fault under
tests/data/workflows/ breaks exactly one rule (its first line says which) and
must be reported by that rule alone; the clean fixture must pass them all.  The
second half pins down the data flow issue 7 asks of pr.yml, nightly.yml and
release.yml, so a refactor of a workflow cannot quietly drop the gate.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.workflow_rules import PR_CONCURRENCY_GROUP, RULES, Workflow, check

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW_DIR = ROOT / ".github" / "workflows"
WORKFLOWS = sorted(WORKFLOW_DIR.glob("*.y*ml"))
FIXTURES = sorted((ROOT / "tests" / "data" / "workflows").glob("*.yml"))
SECRETS = (
    "OPGATE_SLACK_WEBHOOK_URL",
    "OPGATE_FEISHU_WEBHOOK_URL",
    "OPGATE_FEISHU_SECRET",
    "OPGATE_DINGTALK_WEBHOOK_URL",
    "OPGATE_DINGTALK_SECRET",
    "OPGATE_WECOM_WEBHOOK_URL",
    "OPGATE_TEAMS_WEBHOOK_URL",
    "OPGATE_DISCORD_WEBHOOK_URL",
    "OPGATE_WEBHOOK_URL",
)


def load(name: str) -> Workflow:
    return Workflow.load(WORKFLOW_DIR / name)


def runs(job: dict[str, Any]) -> str:
    return "\n".join(str(step.get("run", "")) for step in job.get("steps", []))


def test_the_three_workflows_exist() -> None:
    assert {p.name for p in WORKFLOWS} >= {"pr.yml", "nightly.yml", "release.yml"}


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_keeps_every_rule(path: Path) -> None:
    violations = check(path)
    assert not violations, "\n".join(map(str, violations))


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_planted_fault_is_caught_by_its_rule_alone(path: Path) -> None:
    header = path.read_text(encoding="utf-8").splitlines()[0]
    match = re.fullmatch(r"# expect: ([\w-]+)", header)
    assert match, f"{path}:1: fixtures start with `# expect: <rule>`"
    expected = set() if match[1] == "none" else {match[1]}
    violations = check(path)
    assert {v.rule for v in violations} == expected, "\n".join(map(str, violations))
    assert all(re.search(r"\.yml:\d+$", v.where) for v in violations), "violations say file:line"


def test_every_rule_has_a_planted_fault() -> None:
    caught = {v.rule for path in FIXTURES for v in check(path)}
    assert caught == set(RULES)


def test_on_is_a_key_not_yaml11_true() -> None:
    assert load("pr.yml").triggers == {"pull_request"}
    assert load("nightly.yml").triggers == {"schedule", "workflow_dispatch"}
    assert load("release.yml").triggers == {"release"}


def test_one_version_of_each_action_everywhere() -> None:
    refs: dict[str, set[str]] = {}
    for path in WORKFLOWS:
        for ref in re.findall(r"uses:\s*([\w./-]+)@([0-9a-f]{40})", path.read_text(encoding="utf-8")):
            refs.setdefault(ref[0], set()).add(ref[1])
    assert refs, "no pinned actions found"
    assert {a: shas for a, shas in refs.items() if len(shas) > 1} == {}


def test_pr_plan_shards_publish_gate() -> None:
    wf = load("pr.yml")
    jobs = wf.data["jobs"]
    assert set(jobs) == {"lint", "tests", "plan", "shards", "publish", "gate"}
    assert wf.data["concurrency"]["group"] == PR_CONCURRENCY_GROUP
    assert "python noxfile.py -s lint" in runs(jobs["lint"])
    assert "bash .ci/run" in runs(jobs["tests"])

    plan = jobs["plan"]
    assert "opgate plan --format gha --max-jobs" in runs(plan)
    assert plan["outputs"]["matrix"] == "${{ steps.plan.outputs.matrix }}"

    shards = jobs["shards"]
    assert shards["strategy"]["matrix"] == "${{ fromJSON(needs.plan.outputs.matrix) }}"
    assert shards["strategy"]["fail-fast"] is False
    assert shards["runs-on"] == "${{ matrix.runs_on }}"
    assert shards["environment"] == "gpu"
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
    assert "NEEDS: ${{ toJSON(needs) }}" in (WORKFLOW_DIR / "pr.yml").read_text(encoding="utf-8")


def test_nightly_runs_everything_and_alerts_with_every_secret_through_env() -> None:
    wf = load("nightly.yml")
    assert wf.data["on"]["schedule"][0]["cron"]
    jobs = wf.data["jobs"]
    assert {"plan", "shards", "publish", "pages", "alert"} <= set(jobs)
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
