"""Run a GitHub Actions workflow's jobs on this machine, for the local fan-out test.

Not a GitHub emulator: just enough to run opgate's reusable workflow
(.github/workflows/opgate.yml) as written — its ``run:`` scripts with bash
``-eo pipefail`` as GitHub runs them, the ``${{ }}`` expressions it uses
(contexts, ``!``, ``&&``, ``||``, ``==``, ``contains``, ``fromJSON``,
``toJSON``, ``always``), job and step ``if:``, ``needs``, matrix fan-out,
``GITHUB_OUTPUT`` and the step summary.  The few actions it uses are played
by folder copies: checkout (the workspace already is the checkout),
setup-python (this interpreter), upload/download-artifact and the Pages
upload (an ``artifacts/`` folder).  Steps named in ``skip`` (installing
opgate from an index, impossible offline) are recorded as skipped, never
silently dropped.  Anything else it does not know raises.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from tests.workflow_expr import ExpressionError, condition, expand, text_of
from tests.workflow_rules import Workflow


@dataclass
class JobRun:
    result: str = "skipped"
    outputs: dict[str, Any] = field(default_factory=dict)
    skipped_steps: list[str] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)


@dataclass
class LocalRunner:
    """Runs one workflow's jobs in ``workspace``; artifacts go to ``workspace/../artifacts``."""

    workflow: Path
    workspace: Path
    inputs: Mapping[str, Any]
    github: Mapping[str, Any]
    skip: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    summary: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.wf = Workflow.load(self.workflow).data
        declared = (self.wf.get("on") or {}).get("workflow_call", {}).get("inputs") or {}
        unknown = set(self.inputs) - set(declared)
        if unknown:
            raise ExpressionError(f"inputs {sorted(unknown)} are not declared by {self.workflow}")
        self.resolved = {k: self.inputs.get(k, spec.get("default")) for k, spec in declared.items()}
        missing = [k for k, spec in declared.items() if spec.get("required") and k not in self.inputs]
        if missing:
            raise ExpressionError(f"required inputs {missing} not given")
        self.artifacts = self.workspace.parent / "artifacts"
        self.artifacts.mkdir(exist_ok=True)

    def run(self) -> dict[str, JobRun]:
        jobs: dict[str, JobRun] = {}
        pending = dict(self.wf["jobs"])
        while pending:
            ready = [n for n, j in pending.items() if set(_needs(j)) <= set(jobs)]
            if not ready:
                raise ExpressionError(f"jobs {sorted(pending)} wait on each other")
            for name in ready:
                jobs[name] = self.job(name, pending.pop(name), jobs)
        return jobs

    def _contexts(self, needs: Mapping[str, JobRun], names: Sequence[str]) -> dict[str, Any]:
        return {
            "inputs": self.resolved,
            "github": self.github,
            "needs": {n: {"result": needs[n].result, "outputs": needs[n].outputs} for n in names},
            "env": {},
            "vars": {},
            "secrets": {},
        }

    def job(self, name: str, spec: Mapping[str, Any], done: Mapping[str, JobRun]) -> JobRun:
        needs = _needs(spec)
        contexts = self._contexts(done, needs)
        ok = all(done[n].result == "success" for n in needs)
        if not condition(spec.get("if"), contexts, ok):
            return JobRun("skipped")
        strategy = expand((spec.get("strategy") or {}).get("matrix"), contexts)
        entries = strategy["include"] if isinstance(strategy, dict) else [None]
        runs = [self.one_job(spec, {**contexts, "matrix": entry or {}}) for entry in entries]
        result = JobRun("success" if all(r.result == "success" for r in runs) else "failure")
        for r in runs:
            result.outputs.update(r.outputs)
            result.skipped_steps += r.skipped_steps
            result.logs += r.logs
        return result

    def one_job(self, spec: Mapping[str, Any], contexts: dict[str, Any]) -> JobRun:
        run = JobRun("success")
        steps: dict[str, Any] = {}
        contexts = {**contexts, "steps": steps}
        base_env = {**expand(self.wf.get("env") or {}, contexts), **expand(spec.get("env") or {}, contexts)}
        for step in spec.get("steps") or []:
            label = str(step.get("name") or step.get("uses") or step.get("run", "")[:40])
            if not condition(step.get("if"), contexts, run.result == "success"):
                continue
            if any(fnmatchcase(label, pattern) for pattern in self.skip):
                run.skipped_steps.append(label)
                continue
            outputs, ok, log = self.step(step, contexts, base_env)
            run.logs.append(f"--- {label}\n{log}")
            if step.get("id"):
                steps[step["id"]] = {"outputs": outputs}
            if not ok and not step.get("continue-on-error"):
                run.result = "failure"
        run.outputs = {k: text_of(v) for k, v in expand(spec.get("outputs") or {}, contexts).items()}
        return run

    def step(
        self, step: Mapping[str, Any], contexts: Mapping[str, Any], base_env: Mapping[str, Any]
    ) -> tuple[dict[str, str], bool, str]:
        if "uses" in step:
            return {}, *self.action(str(step["uses"]).split("@")[0], expand(step.get("with") or {}, contexts))
        env = {**base_env, **expand(step.get("env") or {}, contexts)}
        out_file = self.workspace.parent / "github_output"
        summary = self.workspace.parent / "step_summary"
        out_file.write_text("")
        summary.touch()
        script = self.workspace.parent / "step.sh"
        script.write_text(str(step["run"]))
        cwd = self.workspace / str(step.get("working-directory", "."))
        full_env = {
            **os.environ,
            **self.env,
            **{k: text_of(v) for k, v in env.items()},
            "GITHUB_OUTPUT": str(out_file),
            "GITHUB_STEP_SUMMARY": str(summary),
            "GITHUB_REPOSITORY": str(self.github["repository"]),
            "GITHUB_EVENT_NAME": str(self.github["event_name"]),
        }
        done = subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
            cwd=cwd, env=full_env, capture_output=True, text=True, timeout=900, check=False,
        )  # fmt: skip
        outputs = dict(line.split("=", 1) for line in out_file.read_text().splitlines() if "=" in line)
        return outputs, done.returncode == 0, done.stdout + done.stderr

    def action(self, name: str, args: Mapping[str, Any]) -> tuple[bool, str]:
        if name in ("actions/checkout", "actions/setup-python"):
            return True, f"{name}: the workspace is the checkout, this interpreter the Python"
        if name in ("actions/upload-artifact", "actions/upload-pages-artifact"):
            return self.upload(str(args.get("name") or "github-pages"), args)
        if name == "actions/download-artifact":
            return self.download(args)
        raise ExpressionError(f"no local stand-in for action {name}")

    def upload(self, artifact: str, args: Mapping[str, Any]) -> tuple[bool, str]:
        source = self.workspace / str(args["path"])
        dest = self.artifacts / artifact
        if not source.exists():
            return args.get("if-no-files-found") != "error", f"{source}: nothing to upload"
        if dest.exists():
            return False, f"artifact {artifact} uploaded twice"
        if source.is_dir():
            shutil.copytree(source, dest)
        else:
            dest.mkdir(parents=True)
            shutil.copy2(source, dest / source.name)
        return True, f"uploaded {artifact}"

    def download(self, args: Mapping[str, Any]) -> tuple[bool, str]:
        target = self.workspace / str(args["path"])
        if "name" in args:
            found = self.artifacts / str(args["name"])
            if not found.exists():
                return False, f"no artifact {args['name']}"
            shutil.copytree(found, target, dirs_exist_ok=True)
            return True, f"downloaded {args['name']}"
        for found in sorted(self.artifacts.iterdir()):
            if fnmatchcase(found.name, str(args["pattern"])):
                shutil.copytree(found, target / found.name, dirs_exist_ok=True)
        return True, f"downloaded {args['pattern']}"


def _needs(job: Mapping[str, Any]) -> list[str]:
    needs = job.get("needs") or []
    return [needs] if isinstance(needs, str) else list(needs)
