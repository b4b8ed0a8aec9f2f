"""From two real runs to a chat alert on every platform, end to end.

The base run validates the zoo's correct RMSNorm; the head run is the same op
(same name, same cell ids) after a planted regression: its entry point now
hides a ``.contiguous()``.  Real workers validate both, ``reports publish``
and ``reports diff`` compare them, and ``reports alert`` posts the new
fallbacks to each platform's receiver on loopback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from opgate.reports.alerts.registry import PLATFORMS
from tests.data.reports.receiver import serve
from tests.test_alerts_platforms import OK_REPLIES, PATHS, env_for

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parent.parent
ZOO = REPO / "tests" / "zoo"
CONFIG = """matrix_version: 1
ops: [zoo_good]
implementations: ["*"]
torch: [installed]
arch: [cpu]
dtype: [fp32]
layout: [contiguous, transposed, strided]
mode: [eager]
"""


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, (str(ZOO), os.environ.get("PYTHONPATH")))),
        **(env or {}),
    }
    return subprocess.run(
        [sys.executable, *args], cwd=REPO, env=full_env, capture_output=True, text=True, check=False
    )


def _regressed_ops(tmp: Path) -> Path:
    """zoo_good's spec, its entry point swapped for the hidden-copy implementation."""
    spec = (ZOO / "good" / "spec.yaml").read_text()
    spec = spec.replace("zoo_ops.good", "zoo_ops.hidden_copy").replace(
        "zoo::good_rms_norm", "zoo::hidden_copy_rms_norm"
    )
    folder = tmp / "ops" / "zoo_good"
    folder.mkdir(parents=True)
    (folder / "spec.yaml").write_text(spec)
    return tmp / "ops"


@pytest.fixture(scope="module")
def diff_json(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("real-runs")
    config = tmp / "matrix.yaml"
    config.write_text(CONFIG)
    runs = {"base": ["--ops-path", str(ZOO)], "head": ["--ops-path", str(_regressed_ops(tmp))]}
    for name, ops in runs.items():
        run = _cli("-m", "opgate.validators", "run", "--config", str(config), *ops, "--out", str(tmp / name),
                   "--no-progress", "--retries", "0")  # fmt: skip
        assert run.returncode in (0, 1), run.stderr
        pub = _cli(
            "-m", "opgate.reports", "publish", "--in", str(tmp / name), "--out", str(tmp / f"{name}-report")
        )
        assert pub.returncode == 0, pub.stderr
    out = tmp / "diff.json"
    diff = _cli("-m", "opgate.reports", "diff", "--base", str(tmp / "base-report" / "compat.json"),
                "--head", str(tmp / "head-report" / "compat.json"), "--format", "json", "--out", str(out),
                "--fail-on-regression")  # fmt: skip
    assert diff.returncode == 1, diff.stderr  # regressions found
    doc: dict[str, Any] = json.loads(out.read_text())
    doc["_path"] = str(out)
    return doc


def test_diff_of_real_runs_lists_exactly_the_planted_fallbacks(diff_json: dict[str, Any]) -> None:
    text = json.dumps(diff_json)
    assert "zoo_good.triton-" in text
    for layout in ("transposed", "strided"):
        assert f"-cpu-fp32-{layout}-eager" in text
    assert "-cpu-fp32-contiguous-eager" not in text  # a contiguous input needs no copy: unchanged


@pytest.mark.parametrize("platform", sorted(PLATFORMS))
def test_alert_reaches_every_platform(diff_json: dict[str, Any], platform: str, tmp_path: Path) -> None:
    with serve(OK_REPLIES[platform]) as receiver:
        sent = _cli("-m", "opgate.reports", "alert", "--diff", diff_json["_path"], "--platform", platform,
                    "--run-id", "e2e-1", "--state", str(tmp_path / "state.json"),
                    env=env_for(platform, receiver))  # fmt: skip
        assert sent.returncode == 0, sent.stderr
        assert len(receiver.requests) == 1
        body = receiver.requests[0].body.decode()
        assert "transposed-eager" in body
        assert "strided-eager" in body
        token = PATHS[platform].rsplit("/", 1)[-1].split("=")[-1]
        assert token not in sent.stdout + sent.stderr
