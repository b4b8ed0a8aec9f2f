"""Diffs between two published matrices: categories, the perf rule, Markdown budget, exit codes."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from opgate.reports import compat, diff, diff_md
from opgate.reports.perf import PerfRule, mann_whitney_greater, perf_regressions
from opgate.validators.result import Verdict
from tests.data.reports.fixtures import (
    FAIL_CELL,
    LOST_BUILD,
    NEW_FAILURE,
    NEW_FALLBACK,
    PERF_CELL,
    cpu_run,
    gpu_run,
    publish_pair,
    write_run,
)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return publish_pair(tmp_path_factory.mktemp("pair"))


@pytest.fixture(scope="module")
def doc(pair: tuple[Path, Path]) -> dict[str, Any]:
    base, head = pair
    result: dict[str, Any] = diff.compute(compat.load(base), compat.load(head), "base", "head").to_json()
    return result


def cells(doc: dict[str, Any], category: str) -> list[str]:
    return [c["cell"] for c in doc[category]]


def test_categories(doc: dict[str, Any]) -> None:
    assert cells(doc, "new_failures") == [NEW_FAILURE]
    assert cells(doc, "new_fallbacks") == [NEW_FALLBACK]
    assert cells(doc, "fixes") == [FAIL_CELL]
    assert cells(doc, "became_untested") == [LOST_BUILD]
    assert doc["other_changes"] == []
    failure = doc["new_failures"][0]
    assert (failure["base"], failure["head"], failure["device"]) == ("pass", "fail", "cpu")
    assert failure["reason"].startswith("correctness: max err 4.0e-02")
    assert failure["repro"].startswith("opgate run --select")
    assert doc["became_untested"][0]["reason"] == "nvcc 13.0 not found"
    assert doc["summary"]["regressions"] == 4
    assert doc["summary"]["unchanged"] == len(cpu_run().cells) + len(gpu_run().cells) - 4


def test_planted_slowdown_is_a_perf_regression(doc: dict[str, Any]) -> None:
    regressions = doc["perf_regressions"]
    assert {(r["cell"], r["shape"]) for r in regressions} == {
        (PERF_CELL, "4096x4096"),
        (PERF_CELL, "32768x8192"),
    }
    for r in regressions:
        assert 0.07 < r["change"] < 0.13
        assert r["p_value"] < 1e-6
        assert r["gpu"] == "NVIDIA H200"


def publish_gpu(
    root: Path, name: str, slowdown: float, seed: int, history: Path | None = None
) -> dict[str, Any]:
    from opgate.reports.publish import publish

    out = root / name
    publish([write_run(gpu_run(slowdown=slowdown, seed=seed), root / f"in-{name}")], out, history=history)
    return compat.load(out / "compat.json").to_json()


def test_aa_runs_raise_no_alarm_and_slowdowns_are_caught(tmp_path: Path) -> None:
    """20 unchanged re-runs give at most 1 alarm; a 10% slowdown is caught in at least 19 of 20."""
    base = publish_gpu(tmp_path, "base", 1.0, seed=100)
    false_alarms = caught = bare_alarms = 0
    for i in range(20):
        same = publish_gpu(tmp_path, f"aa{i}", 1.0, seed=200 + i)
        slow = publish_gpu(tmp_path, f"slow{i}", 1.10, seed=300 + i)
        false_alarms += bool(perf_regressions(base, same))
        bare_alarms += bool(perf_regressions(base, same, PerfRule(min_effect=0.0)))
        caught += bool(perf_regressions(base, slow))
    assert false_alarms <= 1
    assert caught >= 19
    assert bare_alarms >= 2  # run-to-run drift fools the test alone: the effect-size gate is load-bearing


def test_small_slowdown_below_min_effect_is_not_flagged(tmp_path: Path) -> None:
    base = publish_gpu(tmp_path, "base", 1.0, seed=1)
    slightly = publish_gpu(tmp_path, "slightly", 1.03, seed=2)
    assert perf_regressions(base, slightly) == []
    assert (
        perf_regressions(base, slightly, PerfRule(min_effect=0.01)) != []
    )  # the test, not the data, decided


def test_no_samples_no_verdict(tmp_path: Path) -> None:
    base = publish_gpu(tmp_path, "base", 1.0, seed=1)
    slow = publish_gpu(tmp_path, "slow", 1.5, seed=2)
    for series in slow["perf"]["series"]:
        for run in series["runs"]:
            run.pop("samples_us", None)
    assert perf_regressions(base, slow) == []


def test_head_with_base_history_but_no_new_run_is_not_judged(tmp_path: Path) -> None:
    base_doc = publish_gpu(tmp_path, "base", 1.0, seed=1)
    from opgate.reports.publish import publish

    publish(
        [write_run(cpu_run(), tmp_path / "cpu")],
        tmp_path / "cpu-only",
        history=tmp_path / "base" / "compat.json",
    )
    head = compat.load(tmp_path / "cpu-only" / "compat.json").to_json()
    assert perf_regressions(base_doc, head) == []


def test_mann_whitney_direction_and_ties() -> None:
    rng = random.Random(0)
    base = [100 + rng.gauss(0, 1) for _ in range(30)]
    slower = [110 + rng.gauss(0, 1) for _ in range(30)]
    assert mann_whitney_greater(slower, base) < 1e-9
    assert mann_whitney_greater(base, slower) > 1 - 1e-9
    assert 0.3 < mann_whitney_greater(base, base) < 0.7
    assert mann_whitney_greater([1.0] * 10, [1.0] * 10) == 1.0  # all tied: no evidence


def test_verdict_change_on_another_machine_is_matched_by_device(tmp_path: Path) -> None:
    """A triton bump changes the env key; the diff still pairs the cells by (id, device)."""
    from opgate.reports.publish import publish

    base_run, head_run = cpu_run(), cpu_run({NEW_FAILURE: (Verdict.FAIL, "boom")})
    for cell in head_run.cells:
        cell.env = {**cell.env, "triton": "3.9.0"}
        cell.env.pop("env_key", None)
    publish([write_run(base_run, tmp_path / "b")], tmp_path / "base")
    publish([write_run(head_run, tmp_path / "h")], tmp_path / "head")
    result = diff.compute(
        compat.load(tmp_path / "base" / "compat.json"), compat.load(tmp_path / "head" / "compat.json")
    )
    assert cells(result.to_json(), "new_failures") == [NEW_FAILURE]
    assert result.to_json()["became_untested"] == []


def test_markdown_lists_everything_and_escapes(doc: dict[str, Any]) -> None:
    md = diff_md.render(doc, report_url="https://ci.example/r/1")
    assert "❌ New failures **1**" in md
    assert "📉 Perf regressions **2**" in md
    assert f"| `{NEW_FAILURE}` | cpu | pass → fail |" in md
    assert "| +" in md
    assert "Full report: https://ci.example/r/1" in md
    assert "Mann-Whitney" in md


def test_markdown_links_each_cell_to_its_evidence(doc: dict[str, Any]) -> None:
    dashboard = "https://o.github.io/r/index.html"
    md = diff_md.render(doc, dashboard_url=dashboard)
    assert f"| [`{NEW_FAILURE}`]({dashboard}#cell={NEW_FAILURE}) | cpu | pass → fail |" in md
    assert f"| [`{PERF_CELL}`]({dashboard}#cell={PERF_CELL}) |" in md
    assert "](" not in diff_md.render(doc), "no dashboard, no links"


def test_markdown_respects_the_byte_budget(doc: dict[str, Any]) -> None:
    big = json.loads(json.dumps(doc))
    template = big["new_failures"][0]
    big["new_failures"] = [
        {**template, "cell": f"{template['cell']}-{i}", "reason": "é" * 300} for i in range(20000)
    ]
    big["summary"]["new_failures"] = 20000
    md = diff_md.render(big, report_url="https://ci.example/r/1")
    assert len(md.encode()) <= diff_md.DEFAULT_BUDGET < diff_md.STEP_SUMMARY_LIMIT
    assert "more row(s) left out; see the full list at https://ci.example/r/1" in md
    assert "Perf regressions (2)" in md  # later sections are still announced
    small = diff_md.render(big, budget=8000)
    assert len(small.encode()) <= 8000


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "opgate.reports", "diff", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.integration
def test_cli_formats_and_exit_codes(pair: tuple[Path, Path], tmp_path: Path) -> None:
    base, head = pair
    out = tmp_path / "diff.json"
    gated = cli(
        "--base",
        str(base),
        "--head",
        str(head),
        "--format",
        "json",
        "--out",
        str(out),
        "--fail-on-regression",
    )
    assert gated.returncode == 1
    assert "CellsFailed: 4 regression(s)" in gated.stderr
    written = diff.load(out)  # valid against the diff schema
    assert written["summary"]["regressions"] == 4
    md = cli("--base", str(base), "--head", str(head))
    assert md.returncode == 0
    assert md.stdout.startswith("## opgate: compatibility diff")
    same = cli("--base", str(base), "--head", str(base), "--fail-on-regression")
    assert same.returncode == 0
    assert "No regressions." in same.stdout
    missing = cli("--base", str(tmp_path / "nope.json"), "--head", str(head))
    assert missing.returncode == 7
    assert "cannot read compat file" in missing.stderr
