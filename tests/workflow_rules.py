"""The hardening rules opgate's GitHub Actions workflows must keep, as checkable code.

A workflow that runs pull-request code on self-hosted GPU machines is an attack
surface: an expression expanded into a shell script is a command injection, a
tag-pinned action can be swapped under us, a fork PR on a self-hosted runner can
keep the machine.  Each rule is a function ``Workflow -> list[Violation]`` so the
test can show every one of them catching a planted fault (tests/data/workflows/).

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
#: Labels of self-hosted runners besides ``self-hosted`` itself (.github/actionlint.yaml).
SELF_HOSTED_LABELS = frozenset({"self-hosted", "gpu-sm80", "gpu-sm90"})
#: What justifies a job-level ``write`` scope: something in the job that uses it.
WRITE_USES: dict[str, tuple[str, ...]] = {
    "contents": (r"\bgh release (upload|create|edit|delete-asset)\b", r"\bgit push\b"),
    "pull-requests": (r"\bgh pr (create|comment|edit|review|merge)\b",),
    "issues": (r"\bgh issue (create|comment|edit|close)\b",),
    "pages": (r"actions/deploy-pages@",),
    "id-token": (r"actions/deploy-pages@",),
    "actions": (r"\bgh (run (rerun|cancel)|workflow run)\b",),
}
SHA_REF = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+(/[A-Za-z0-9_./-]+)?@[0-9a-f]{40}$")
VERSION_COMMENT = re.compile(r"#\s*v\d+(\.\d+)*\b")
HEAD_REF = re.compile(r"pull_request\.head|head_ref|refs/pull/|github\.event\.pull_request\.merge")
UNTRUSTED = re.compile(r"\$\{\{[^}]*\b(github\.event\.|github\.head_ref|inputs\.)")


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

    def jobs(self) -> Iterator[tuple[str, LineDict]]:
        jobs = self.data.get("jobs") or {}
        yield from jobs.items()

    def job_line(self, name: str) -> int:
        return int(self.data["jobs"].line_of(name))


def _steps(job: LineDict) -> list[LineDict]:
    return [s for s in job.get("steps") or [] if isinstance(s, LineDict)]


def _job_text(job: LineDict) -> str:
    """Everything a job runs or uses, to look for what a write scope is needed for."""
    return "\n".join(str(s.get("run", "")) + "\n" + str(s.get("uses", "")) for s in _steps(job))


@rule("top-permissions")
def top_permissions(wf: Workflow) -> list[Violation]:
    perms = wf.data.get("permissions")
    if perms != {"contents": "read"}:
        line = wf.data.line_of("permissions") if "permissions" in wf.data else 1
        return [
            Violation(
                "top-permissions",
                wf.at(line),
                f"top-level permissions must be exactly `contents: read` (got {perms!r}); add scopes per job",
            )
        ]
    return []


@rule("job-permissions")
def job_permissions(wf: Workflow) -> list[Violation]:
    out = []
    for name, job in wf.jobs():
        perms = job.get("permissions")
        where = wf.at(job.line_of("permissions"))
        if isinstance(perms, str):
            if perms != "read-all":
                out.append(Violation("job-permissions", where, f"job {name}: `permissions: {perms}`"))
            continue
        text = _job_text(job)
        for scope, level in (perms or {}).items():
            if level != "write":
                continue
            uses = WRITE_USES.get(scope, ())
            if not any(re.search(p, text) for p in uses):
                out.append(
                    Violation(
                        "job-permissions",
                        where,
                        f"job {name}: `{scope}: write` but nothing in the job uses it",
                    )
                )
    return out


@rule("pinned-actions")
def pinned_actions(wf: Workflow) -> list[Violation]:
    out = []
    holders = [(job, f"job {name}") for name, job in wf.jobs()]
    holders += [(step, f"job {name}") for name, job in wf.jobs() for step in _steps(job)]
    for holder, label in holders:
        ref = holder.get("uses")
        if not isinstance(ref, str) or ref.startswith("./"):
            continue
        line = holder.line_of("uses")
        source = wf.lines[line - 1]
        if ref.startswith("docker://"):
            ok = "@sha256:" in ref
        else:
            ok = bool(SHA_REF.match(ref)) and bool(VERSION_COMMENT.search(source))
        if not ok:
            out.append(
                Violation(
                    "pinned-actions",
                    wf.at(line),
                    f"{label}: `{ref}` is not pinned by full commit SHA with a `# vX.Y.Z` comment",
                )
            )
    return out


@rule("expression-in-run")
def no_expressions_in_run(wf: Workflow) -> list[Violation]:
    out = []
    for name, job in wf.jobs():
        for step in _steps(job):
            run = step.get("run")
            if isinstance(run, str) and "${{" in run:
                out.append(
                    Violation(
                        "expression-in-run",
                        wf.at(step.line_of("run")),
                        f"job {name}: `${{{{ }}}}` inside run: (pass it through env:)",
                    )
                )
            script = (step.get("with") or {}).get("script")
            if isinstance(script, str) and UNTRUSTED.search(script):
                out.append(
                    Violation(
                        "expression-in-run",
                        wf.at(step.line_of("with")),
                        f"job {name}: untrusted context expanded into a script",
                    )
                )
    return out


@rule("prt-head-checkout")
def no_prt_head_checkout(wf: Workflow) -> list[Violation]:
    if "pull_request_target" not in wf.triggers:
        return []
    out = []
    for name, job in wf.jobs():
        for step in _steps(job):
            if not str(step.get("uses", "")).startswith("actions/checkout@"):
                continue
            opts = step.get("with") or {}
            if any(HEAD_REF.search(str(opts.get(k, ""))) for k in ("ref", "repository")):
                out.append(
                    Violation(
                        "prt-head-checkout",
                        wf.at(step.line_of("uses")),
                        f"job {name}: pull_request_target checks out the PR head",
                    )
                )
    return out


def _self_hosted(runs_on: Any) -> bool:
    if isinstance(runs_on, str):
        return "${{" in runs_on or runs_on in SELF_HOSTED_LABELS
    if isinstance(runs_on, list):
        return any(_self_hosted(label) for label in runs_on)
    return isinstance(runs_on, dict)  # {group: ..., labels: ...}: runner groups are self-hosted


@rule("fork-gate")
def fork_gate(wf: Workflow) -> list[Violation]:
    if not wf.triggers & PR_EVENTS:
        return []
    out = []
    for name, job in wf.jobs():
        if not _self_hosted(job.get("runs-on")):
            continue
        env = job.get("environment")
        env_name = env.get("name") if isinstance(env, dict) else env
        cond = " ".join(str(job.get("if", "")).split())
        problems = []
        if env_name != GPU_ENVIRONMENT:
            problems.append(f"environment `{GPU_ENVIRONMENT}` (required reviewers)")
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


@rule("persist-credentials")
def checkout_credentials(wf: Workflow) -> list[Violation]:
    out = []
    for name, job in wf.jobs():
        perms = job.get("permissions")
        may_push = isinstance(perms, dict) and perms.get("contents") == "write"
        for step in _steps(job):
            if not str(step.get("uses", "")).startswith("actions/checkout@"):
                continue
            persist = (step.get("with") or {}).get("persist-credentials")
            if persist is not False and not may_push:
                out.append(
                    Violation(
                        "persist-credentials",
                        wf.at(step.line_of("uses")),
                        f"job {name}: checkout keeps the token in .git/config (`persist-credentials: false`)",
                    )
                )
    return out


def check(path: Path) -> list[Violation]:
    wf = Workflow.load(path)
    return [v for fn in RULES.values() for v in fn(wf)]
