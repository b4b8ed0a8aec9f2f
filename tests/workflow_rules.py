"""opgate's own GPU-gate rules for its GitHub Actions workflows, as checkable code.

General Actions hardening (expressions expanded into scripts, unpinned actions,
excessive or undocumented permissions, credentials left in the checkout,
pull_request_target) is zizmor's job (``.github/zizmor.yml``, run by ``nox -s
lint``).  What is left here is what only opgate knows: pull-request code runs
on self-hosted GPU machines, so a fork PR must not reach one without the
``gpu`` environment and the same-repo-or-``gpu-ok`` condition, a superseded
push must free its GPU runners, no job may hold a machine forever, and a shard
matrix must report every cell.  Each rule is a function ``Workflow ->
list[Violation]`` so the test can show every one of them catching a planted
fault (tests/data/workflows/).

YAML is read as YAML 1.2 would (only true/false are booleans; ``on`` stays a key)
and every mapping remembers the line of each key, so violations say file:line.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

PR_EVENTS = frozenset({"pull_request", "pull_request_target"})
PR_CONCURRENCY_GROUP = "${{ github.workflow }}-${{ github.event.pull_request.number || github.ref }}"
SAME_REPO = "github.event.pull_request.head.repo.full_name == github.repository"
GPU_OK_LABEL = "contains(github.event.pull_request.labels.*.name, 'gpu-ok')"
GPU_ENVIRONMENT = "gpu"
#: Self-hosted runner labels: the ones actionlint is told about (the matrix's GPU runners).
ACTIONLINT_CONFIG = Path(__file__).resolve().parents[1] / ".github" / "actionlint.yaml"
SELF_HOSTED_LABELS = frozenset(
    {
        "self-hosted",
        *yaml.safe_load(ACTIONLINT_CONFIG.read_text(encoding="utf-8"))["self-hosted-runner"]["labels"],
    }
)


Rule = Callable[["Workflow"], list["Violation"]]
#: rule id -> check, in the order they are reported.
RULES: dict[str, Rule] = {}


def rule(rule_id: str) -> Callable[[Rule], Rule]:
    """Register a check under the id its violations carry."""

    def register(fn: Rule) -> Rule:
        RULES[rule_id] = fn
        return fn

    return register


class LineDict(dict[Any, Any]):
    """A YAML mapping that remembers the (1-based) line of each key."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: dict[Any, int] = {}
        self.line = 0

    def line_of(self, key: Any) -> int:
        return self.lines.get(key, self.line)


class _Loader(yaml.SafeLoader):
    """Safe loading, YAML 1.2 booleans, key lines recorded."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def _mapping(loader: _Loader, node: yaml.MappingNode) -> LineDict:
    loader.flatten_mapping(node)
    out = LineDict()
    out.line = node.start_mark.line + 1
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        out[key] = loader.construct_object(value_node, deep=True)
        out.lines[key] = key_node.start_mark.line + 1
    return out


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


@dataclass(frozen=True)
class Violation:
    rule: str
    where: str  # file:line
    message: str

    def __str__(self) -> str:
        return f"{self.where}: [{self.rule}] {self.message}"


@dataclass(frozen=True)
class Workflow:
    path: Path
    data: LineDict
    lines: list[str]

    @classmethod
    def load(cls, path: Path) -> Workflow:
        text = path.read_text(encoding="utf-8")
        data = yaml.load(text, Loader=_Loader)  # _Loader derives from SafeLoader
        if not isinstance(data, LineDict):
            raise ValueError(f"{path}:1: a workflow must be a mapping")
        return cls(path, data, text.splitlines())

    def at(self, line: int) -> str:
        return f"{self.path}:{line}"

    @property
    def triggers(self) -> set[str]:
        on = self.data.get("on", {})
        if isinstance(on, str):
            return {on}
        return set(on)

    @property
    def reusable(self) -> bool:
        """Called by other workflows (``on: workflow_call``): any of them may be a PR workflow."""
        return "workflow_call" in self.triggers

    def jobs(self) -> Iterator[tuple[str, LineDict]]:
        jobs = self.data.get("jobs") or {}
        yield from jobs.items()

    def job_line(self, name: str) -> int:
        return int(self.data["jobs"].line_of(name))


def _self_hosted(runs_on: Any) -> bool:
    if isinstance(runs_on, str):
        return "${{" in runs_on or runs_on in SELF_HOSTED_LABELS
    if isinstance(runs_on, list):
        return any(_self_hosted(label) for label in runs_on)
    return isinstance(runs_on, dict)  # {group: ..., labels: ...}: runner groups are self-hosted


def _environment(wf: Workflow, job: LineDict) -> str | None:
    """The job's environment name; ``${{ inputs.X }}`` of a reusable workflow reads X's default."""
    env = job.get("environment")
    name = env.get("name") if isinstance(env, dict) else env
    match = re.fullmatch(r"\$\{\{\s*inputs\.([\w-]+)\s*\}\}", str(name or ""))
    if match and wf.reusable:
        declared = (wf.data["on"].get("workflow_call") or {}).get("inputs") or {}
        return (declared.get(match[1]) or {}).get("default")
    return str(name) if name is not None else None


@rule("fork-gate")
def fork_gate(wf: Workflow) -> list[Violation]:
    """Self-hosted jobs of a PR workflow, or of a reusable one (a PR workflow may call it)."""
    if not wf.triggers & PR_EVENTS and not wf.reusable:
        return []
    out = []
    for name, job in wf.jobs():
        if not _self_hosted(job.get("runs-on")):
            continue
        env_name = _environment(wf, job)
        cond = " ".join(str(job.get("if", "")).split())
        problems = []
        if env_name != GPU_ENVIRONMENT:
            problems.append(f"environment `{GPU_ENVIRONMENT}` (required reviewers; by default, if an input)")
        if SAME_REPO not in cond or GPU_OK_LABEL not in cond or "always()" in cond:
            problems.append("an `if:` allowing only same-repo PRs or the `gpu-ok` label")
        if problems:
            out.append(
                Violation(
                    "fork-gate",
                    wf.at(wf.job_line(name)),
                    f"job {name} may run on a self-hosted runner without " + " and ".join(problems),
                )
            )
    return out


@rule("concurrency")
def concurrency(wf: Workflow) -> list[Violation]:
    conc = wf.data.get("concurrency")
    line = wf.data.line_of("concurrency") if "concurrency" in wf.data else 1
    if wf.triggers == {"workflow_call"}:
        # A called workflow's github.workflow is its caller's: a group here is the caller's own
        # group, and the two runs wait on (or cancel) each other.  The caller owns concurrency.
        if conc is not None:
            return [
                Violation("concurrency", wf.at(line), "a reusable workflow leaves concurrency to its caller")
            ]
        return []
    if wf.triggers & PR_EVENTS:
        if (
            not isinstance(conc, dict)
            or conc.get("group") != PR_CONCURRENCY_GROUP
            or conc.get("cancel-in-progress") is not True
        ):
            return [
                Violation(
                    "concurrency",
                    wf.at(line),
                    f"PR workflows need `group: {PR_CONCURRENCY_GROUP}` with `cancel-in-progress: true`",
                )
            ]
        return []
    group = conc.get("group", "") if isinstance(conc, dict) else str(conc or "")
    if "github.workflow" not in group:
        return [Violation("concurrency", wf.at(line), "a concurrency group keyed on github.workflow")]
    return []


@rule("fail-fast")
def fail_fast_off(wf: Workflow) -> list[Violation]:
    return [
        Violation(
            "fail-fast", wf.at(job.line_of("strategy")), f"job {name}: matrix without `fail-fast: false`"
        )
        for name, job in wf.jobs()
        if isinstance(job.get("strategy"), dict)
        and "matrix" in job["strategy"]
        and job["strategy"].get("fail-fast") is not False
    ]


@rule("timeout")
def timeouts(wf: Workflow) -> list[Violation]:
    return [
        Violation("timeout", wf.at(wf.job_line(name)), f"job {name} has no timeout-minutes")
        for name, job in wf.jobs()
        if "uses" not in job and "timeout-minutes" not in job  # reusable-workflow calls cannot set it
    ]


def check(path: Path) -> list[Violation]:
    wf = Workflow.load(path)
    return [v for fn in RULES.values() for v in fn(wf)]
