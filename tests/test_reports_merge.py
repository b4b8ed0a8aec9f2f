"""Merging shards into one matrix: conflicts, duplicates, missing shards, all-or-nothing publish."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from opgate.matrix.errors import MergeConflict, MissingShard, ResultsFormatError
from opgate.matrix.plan import Plan, Shard
from opgate.reports.merge import merge, read_runs
from opgate.reports.publish import OUTPUT_FILES, publish
from opgate.validators.result import Verdict
from tests.data.reports.fixtures import CPU_ENV, FAIL_CELL, cpu_run, gpu_run, write_run

ROOT = Path(__file__).resolve().parent.parent


def test_identical_duplicates_are_dropped(tmp_path: Path) -> None:
    a = write_run(cpu_run(), tmp_path / "a")
    b = write_run(cpu_run(), tmp_path / "b")  # the same shard downloaded twice
    merged = merge(read_runs([a, b]))
    assert len(merged.entries) == len(cpu_run().cells)
    assert len(merged.sources) == 2
    assert list(merged.environments) == [CPU_ENV["env_key"]]


def test_two_verdicts_for_one_cell_is_a_conflict(tmp_path: Path) -> None:
    a = write_run(cpu_run(), tmp_path / "a")
    b = write_run(cpu_run({FAIL_CELL: (Verdict.PASS, "")}), tmp_path / "b")
    with pytest.raises(MergeConflict) as info:
        merge(read_runs([a, b]))
    message = str(info.value)
    assert FAIL_CELL in message
    assert "fail in " in message
    assert "pass in " in message
    assert str(a / "results.json") in message
    assert str(b / "results.json") in message
    assert info.value.exit_code == 5


def test_same_cell_in_two_environments_is_not_a_conflict(tmp_path: Path) -> None:
    run = cpu_run()
    other = cpu_run({FAIL_CELL: (Verdict.PASS, "")})
    other_env = {**CPU_ENV, "triton": "3.9.0"}
    other_env.pop("env_key")
    for cell in other.cells:
        cell.env = other_env
    merged = merge(read_runs([write_run(run, tmp_path / "a"), write_run(other, tmp_path / "b")]))
    assert len(merged.entries) == 2 * len(run.cells)
    assert len(merged.environments) == 2


def test_missing_results_file_names_the_folder(tmp_path: Path) -> None:
    with pytest.raises(ResultsFormatError, match=f"{tmp_path / 'nope'}/results.json: no results file"):
        read_runs([tmp_path / "nope"])


def test_a_fingerprint_field_the_validators_never_write_is_refused(tmp_path: Path) -> None:
    run = cpu_run()
    guessed = {**CPU_ENV, "torch_version": "2.13.0"}  # a name no writer uses
    for cell in run.cells:
        cell.env = guessed
    path = write_run(run, tmp_path / "a")
    expected = r"results\.json: cell .*unknown fingerprint field.*'torch_version'"
    with pytest.raises(ResultsFormatError, match=expected):
        merge(read_runs([path]))


def manifest(path: Path, shards: dict[str, list[str]]) -> Path:
    plan = Plan(
        tuple(
            Shard(name, ("ubuntu-latest",), "2.13.0", "13.0", tuple(ids), (), 1.0)
            for name, ids in shards.items()
        )
    )
    path.write_text(json.dumps(plan.manifest()))
    return path


def test_missing_shard_refuses_and_leaves_out_untouched(tmp_path: Path) -> None:
    cpu, gpu = cpu_run(), gpu_run()
    cpu_dir = write_run(cpu, tmp_path / "shards" / "cpu-0")
    gpu_dir = write_run(gpu, tmp_path / "shards" / "sm90-0")
    plan = manifest(
        tmp_path / "manifest.json",
        {"cpu-0": [c.id for c in cpu.cells], "sm90-0": [c.id for c in gpu.cells]},
    )
    out = tmp_path / "site"
    out.mkdir()
    previous = {name: f"previous {name}\n" for name in OUTPUT_FILES}
    for name, text in previous.items():
        (out / name).write_text(text)
    (out / "other.txt").write_text("keep me")

    with pytest.raises(MissingShard) as info:
        publish([cpu_dir], out, manifest=plan)
    assert "shard sm90-0 did not report" in str(info.value)
    assert f"{len(gpu.cells)} of {len(gpu.cells)} planned cells missing" in str(info.value)
    assert {p.name for p in out.iterdir()} == {*OUTPUT_FILES, "other.txt"}
    assert all((out / n).read_text() == t for n, t in previous.items())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json", "shards", "site"]  # no temp left

    partial = gpu_run()
    partial.cells = partial.cells[:-2]
    write_run(partial, gpu_dir)
    with pytest.raises(MissingShard, match="shard sm90-0 is incomplete: 2 of"):
        publish([cpu_dir, gpu_dir], out, manifest=plan)

    write_run(gpu, gpu_dir)
    doc = publish([cpu_dir, gpu_dir], out, manifest=plan)
    assert len(doc.entries) == len(cpu.cells) + len(gpu.cells)
    assert json.loads((out / "compat.json").read_text())["schema_version"] == 1
    assert (out / "other.txt").read_text() == "keep me"


def test_publish_into_a_new_folder(tmp_path: Path) -> None:
    out = tmp_path / "deep" / "site"
    publish([write_run(cpu_run(), tmp_path / "cpu")], out)
    assert sorted(p.name for p in out.iterdir()) == sorted(OUTPUT_FILES)
    assert [p.name for p in (tmp_path / "deep").iterdir()] == ["site"]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "opgate.reports", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.integration
def test_cli_exit_codes_and_summary(tmp_path: Path) -> None:
    cpu_dir = write_run(cpu_run(), tmp_path / "cpu")
    gpu_dir = write_run(gpu_run(), tmp_path / "gpu")
    ok = cli("publish", "--in", str(cpu_dir), "--in", str(gpu_dir), "--out", str(tmp_path / "out"))
    assert ok.returncode == 0, ok.stderr
    lines = ok.stdout.splitlines()
    cpu_line = next(line for line in lines if line.startswith(str(CPU_ENV["env_key"])))
    # pass fail fallback error skip unsupported flaky total, as counted from the fixture itself
    counts = [sum(1 for c in cpu_run().cells if c.verdict is v) for v in Verdict]
    assert cpu_line.split()[1:] == [str(n) for n in counts] + [str(len(cpu_run().cells))]
    assert "(NVIDIA H200, sm_90)" in ok.stdout

    conflict_dir = write_run(cpu_run({FAIL_CELL: (Verdict.FLAKY, "passed on re-run")}), tmp_path / "cpu2")
    bad = cli("publish", "--in", str(cpu_dir), "--in", str(conflict_dir), "--out", str(tmp_path / "out2"))
    assert bad.returncode == 5
    assert bad.stderr.startswith("opgate publish: MergeConflict: cell " + FAIL_CELL)
    assert "Traceback" not in bad.stderr
    assert not (tmp_path / "out2").exists()

    plan = manifest(
        tmp_path / "m.json", {"cpu-0": [c.id for c in cpu_run().cells], "gpu": ["x.y-pt2.11-cpu-a-b-c"]}
    )
    missing = cli("publish", "--in", str(cpu_dir), "--out", str(tmp_path / "out3"), "--manifest", str(plan))
    assert missing.returncode == 6
    assert "shard gpu did not report" in missing.stderr


REAL_RUN = ROOT / "tests" / "data" / "reports" / "validators-cpu"


def test_publishes_a_results_file_written_by_the_validators(tmp_path: Path) -> None:
    """A results.json from `opgate run` (frozen), merged with the H200 fixture."""
    real = read_runs([REAL_RUN])[0][1]
    doc = publish([REAL_RUN, write_run(gpu_run(), tmp_path / "gpu")], tmp_path / "out")
    assert len(doc.entries) == len(real.cells) + len(gpu_run().cells)
    assert real.env["env_key"] in doc.environments
    md = (tmp_path / "out" / "compat.md").read_text()
    for cell in real.cells:
        if cell.verdict is Verdict.SKIP:
            assert f"cell(s): {cell.reason}" in md  # untested cells are grouped by reason
        elif cell.verdict is not Verdict.PASS:
            assert f"`{cell.id}` ({cell.verdict.value}," in md
    assert "pt2.13 cpu" in md


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o755), (0o027, 0o750), (0o077, 0o700)])
def test_first_publish_creates_the_folder_like_mkdir(tmp_path: Path, umask: int, mode: int) -> None:
    """The folder is built as a private temp folder, then renamed: it must end with mkdir's mode."""
    source = write_run(cpu_run(), tmp_path / "in")
    previous = os.umask(umask)
    try:
        publish([source], tmp_path / "fresh")
        (tmp_path / "plain").mkdir()
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "fresh").stat().st_mode) == mode
    assert stat.S_IMODE((tmp_path / "plain").stat().st_mode) == mode


def test_incomplete_runs_are_published_marked_and_strict_refuses(tmp_path: Path) -> None:
    run = cpu_run()
    lost = [run.cells[0].id, run.cells[1].id]
    run.cells = run.cells[2:]
    run.planned, run.missing = len(run.cells) + 2, lost
    source = write_run(run, tmp_path / "in")
    doc = publish([source], tmp_path / "out")
    assert doc.missing == sorted(lost)
    assert json.loads((tmp_path / "out" / "compat.json").read_text())["missing"] == sorted(lost)
    md = (tmp_path / "out" / "compat.md").read_text()
    notice = "> **INCOMPLETE:** 2 planned cell(s) have no verdict (a run was interrupted or cut short)"
    assert f"{notice}: {min(lost)}, {max(lost)}" in md
    with pytest.raises(MissingShard, match="--strict"):
        publish([source], tmp_path / "strict", strict=True)
    assert not (tmp_path / "strict").exists()
    other = write_run(cpu_run(shard="cpu-1"), tmp_path / "rerun")  # a re-run that has the cells fills the gap
    assert publish([source, other], tmp_path / "whole", strict=True).missing == []
