"""The pull-request workflow's data flow, end to end, without GitHub.

What .github/workflows/pr.yml does across machines, done here with processes
and folders: ``matrix plan`` shards a handful of real cells (two CPU cells that
run, GPU cells that this machine records as ``skip``); every shard runs as its
own ``validators run`` process into its own folder (the ``results-<shard>``
artifacts); ``reports publish --manifest`` merges them.  Then the failure modes
the gate exists for: a lost shard makes publish refuse with MissingShard's exit
code and leaves the previously published matrix byte for byte as it was; with
the shard restored publish succeeds; the regression check passes a head that
only fixed things and fails a head with a planted regression.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from opgate.matrix.errors import CellsFailed, MissingShard

ROOT = Path(__file__).resolve().parents[1]
SELECT = (
    "rms_norm.triton-*-cpu-fp32-contiguous-eager",
    "rms_norm.triton-*-cpu-fp32-transposed-eager",
    "rms_norm.triton-*-sm_80-fp32-contiguous-eager",
    "rms_norm.triton-*-sm_90-fp32-contiguous-eager",
)
pytestmark = pytest.mark.slow


def opgate(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """One opgate command in its own process, from the repository root (as a CI step runs it)."""
    return subprocess.run(
        [sys.executable, "-m", *args], check=False, cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {
        str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in folder.rglob("*")
        if p.is_file()
    }


def publish(shards: Path, out: Path, manifest: Path) -> subprocess.CompletedProcess[str]:
    ins = [arg for d in sorted(shards.iterdir()) for arg in ("--in", str(d))]
    return opgate("reports", "publish", "--manifest", str(manifest), *ins, "--out", str(out))


def verdicts(compat: Path) -> dict[str, str]:
    return {c["id"]: c["verdict"] for c in json.loads(compat.read_text())["cells"]}


def set_verdict(path: Path, cell_id: str, verdict: str) -> None:
    """Plant a verdict into a results.json / compat.json record, as a changed kernel would."""
    data: dict[str, Any] = json.loads(path.read_text())
    (record,) = [c for c in data["cells"] if c["id"] == cell_id]
    record["verdict"] = verdict
    record["reason"] = "planted by test_fanout_e2e"
    path.write_text(json.dumps(data))


@pytest.fixture(scope="module")
def fanout(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Plan, then run every shard as a separate, concurrent process into shards/<name>."""
    work = tmp_path_factory.mktemp("fanout")
    manifest = work / "plan-manifest.json"
    selects = [arg for glob in SELECT for arg in ("--select", glob)]
    # --target-s 1 splits even two short CPU cells over two shards, as a long matrix would be.
    planned = opgate(
        "matrix", "plan", "--format", "gha", "--max-jobs", "4", "--target-s", "1",
        "--manifest", str(manifest), *selects,
    )  # fmt: skip
    assert planned.returncode == 0, planned.stderr
    include = json.loads(planned.stdout)["include"]
    shards = work / "shards"
    procs = {}
    for shard in include:
        out = shards / f"results-{shard['name']}"
        argv = [sys.executable, "-m", "opgate.validators", "run", "--out", str(out), "--no-progress"]
        argv += [arg for glob in shard["select"] for arg in ("--select", glob)]
        procs[shard["name"]] = subprocess.Popen(
            argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    logs = {name: p.communicate(timeout=600)[0] for name, p in procs.items()}
    codes = {name: p.returncode for name, p in procs.items()}
    assert codes == dict.fromkeys(procs, 0), logs
    return {"work": work, "manifest": manifest, "include": include, "shards": shards}


def test_plan_shards_by_runner_and_each_shard_ran_only_its_cells(fanout: dict[str, Any]) -> None:
    include = fanout["include"]
    names = [s["name"] for s in include]
    assert len(names) == len(set(names)) == 4, names
    labels = {tuple(s["runs_on"]) for s in include}
    assert ("ubuntu-latest",) in labels
    assert any("self-hosted" in ls for ls in labels)
    planned = {s["name"]: set(s["cells"]) for s in json.loads(fanout["manifest"].read_text())["shards"]}
    for name, cells in planned.items():
        ran = json.loads((fanout["shards"] / f"results-{name}" / "results.json").read_text())["cells"]
        assert {c["id"] for c in ran} == cells, name
    every = set().union(*planned.values())
    assert len(every) == 4  # two CPU cells that run, one skip cell per GPU arch
    assert all(c.startswith("rms_norm.triton-") for c in every)


def test_lost_shard_refuses_then_restored_shard_publishes(fanout: dict[str, Any], tmp_path: Path) -> None:
    shards, manifest = fanout["shards"], fanout["manifest"]
    out = tmp_path / "report"
    first = publish(shards, out, manifest)
    assert first.returncode == 0, first.stderr
    before = snapshot(out)
    assert {"compat.json", "compat.md", "index.html"} <= set(before)

    lost = next(s["name"] for s in fanout["include"] if "self-hosted" in s["runs_on"])
    aside = tmp_path / "aside"
    shutil.move(shards / f"results-{lost}", aside)
    try:
        refused = publish(shards, out, manifest)
        assert refused.returncode == MissingShard.exit_code, refused.stdout + refused.stderr
        assert lost in refused.stderr
        assert snapshot(out) == before, "a refused publish must leave the previous matrix untouched"
    finally:
        shutil.move(aside, shards / f"results-{lost}")

    again = publish(shards, out, manifest)
    assert again.returncode == 0, again.stderr
    got = verdicts(out / "compat.json")
    assert sorted(set(got.values())) == ["pass", "skip"], got
    assert sum(v == "skip" for v in got.values()) == 2


def gate_diff(base: Path, head: Path) -> subprocess.CompletedProcess[str]:
    """The gate's regression step, exactly as pr.yml runs it."""
    return opgate(
        "reports", "diff", "--base", str(base), "--head", str(head), "--format", "md", "--fail-on-regression"
    )


def test_gate_passes_a_fix_and_fails_a_planted_regression(fanout: dict[str, Any], tmp_path: Path) -> None:
    shards, manifest = fanout["shards"], fanout["manifest"]
    head = tmp_path / "head"
    assert publish(shards, head, manifest).returncode == 0
    cpu_cell = next(c for c, v in verdicts(head / "compat.json").items() if v == "pass")

    # Base branch had this cell red; the PR fixed it: a fix is not a regression.
    base = tmp_path / "base" / "compat.json"
    base.parent.mkdir()
    shutil.copy(head / "compat.json", base)
    set_verdict(base, cpu_cell, "fail")
    fixed = gate_diff(base, head / "compat.json")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr

    # The PR breaks the same cell: the shard's results say fail, the gate must go red.
    broken_shards = tmp_path / "broken"
    shutil.copytree(shards, broken_shards)
    (results,) = [p for p in broken_shards.glob("*/results.json") if cpu_cell in p.read_text()]
    set_verdict(results, cpu_cell, "fail")
    broken = tmp_path / "broken-report"
    assert publish(broken_shards, broken, manifest).returncode == 0
    regressed = gate_diff(head / "compat.json", broken / "compat.json")
    assert regressed.returncode == CellsFailed.exit_code, regressed.stdout + regressed.stderr
    assert cpu_cell in regressed.stdout
