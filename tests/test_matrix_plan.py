"""CI sharding: job cap, runner/torch separation, LPT balance, exact selection, 1 MB output."""

from __future__ import annotations

import itertools
import json
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from opgate.matrix.cell import Cell, select
from opgate.matrix.errors import ConfigError, ResultsFormatError, UsageError
from opgate.matrix.plan import (
    DEFAULT_ESTIMATE_S,
    GHA_OUTPUT_LIMIT,
    Plan,
    compact_select,
    estimate,
    load_history,
    load_manifest,
    make_plan,
)

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).parent / "data" / "config"
RUNNERS = {
    "cpu": ("ubuntu-latest",),
    "sm_80": ("self-hosted", "linux", "gpu-sm80"),
    "sm_90": ("self-hosted", "linux", "gpu-sm90"),
}


def synthetic(
    ops: int = 6, torches: tuple[str, ...] = ("2.12.1", "2.13.0"), shapes: tuple[str, ...] = ("default",)
) -> list[Cell]:
    """A realistic grid: ops x impls x torch x arch x dtype x layout x mode."""
    grid = itertools.product(
        [f"op{o}" for o in range(ops)],
        ("triton", "cuda"),
        torches,
        ("cpu", "sm_80", "sm_90"),
        ("fp32", "fp16", "bf16"),
        ("contiguous", "transposed", "strided", "offset"),
        ("eager", "compile", "export"),
        shapes,
    )
    cells = [
        Cell(op, impl, torch, "none" if arch == "cpu" else "13.0", arch, dtype, layout, mode, s)
        for op, impl, torch, arch, dtype, layout, mode, s in grid
    ]
    return sorted(cells, key=lambda c: c.id)


def test_at_most_max_jobs_and_every_cell_exactly_once() -> None:
    cells = synthetic()
    for max_jobs in (6, 10, 64, 256):
        plan = make_plan(cells, RUNNERS, max_jobs=max_jobs, target_s=60)
        assert len(plan.shards) <= max_jobs
        owned = [i for s in plan.shards for i in s.cell_ids]
        assert sorted(owned) == [c.id for c in cells]
    assert len(make_plan(cells, RUNNERS, max_jobs=256, target_s=60).shards) > 64


def test_shards_never_mix_runner_labels_torch_or_cuda() -> None:
    cells = synthetic()
    by_id = {c.id: c for c in cells}
    plan = make_plan(cells, RUNNERS, max_jobs=20, target_s=60)
    for shard in plan.shards:
        members = [by_id[i] for i in shard.cell_ids]
        assert {RUNNERS[c.arch] for c in members} == {shard.runs_on}
        assert {c.torch for c in members} == {shard.torch}
        assert {c.cuda for c in members} == {shard.cuda}
    assert len({s.name for s in plan.shards}) == len(plan.shards)
    assert {s.name.rsplit("-", 1)[0] for s in plan.shards} == {
        "cpu-pt2.12",
        "cpu-pt2.13",
        "sm_80-pt2.12-cu13.0",
        "sm_80-pt2.13-cu13.0",
        "sm_90-pt2.12-cu13.0",
        "sm_90-pt2.13-cu13.0",
    }


def test_shared_label_sets_share_shards() -> None:
    same = {**RUNNERS, "sm_80": RUNNERS["sm_90"]}
    plan = make_plan(synthetic(torches=("2.13.0",)), same, max_jobs=2)
    assert sorted(s.name for s in plan.shards) == ["cpu-pt2.13-1of1", "sm_80+sm_90-pt2.13-cu13.0-1of1"]


def test_limits_are_enforced() -> None:
    cells = synthetic()
    with pytest.raises(UsageError, match="at least 6"):
        make_plan(cells, RUNNERS, max_jobs=5)
    for bad in (0, 257):
        with pytest.raises(UsageError, match=r"1\.\.256"):
            make_plan(cells, RUNNERS, max_jobs=bad)
    with pytest.raises(ConfigError, match="no labels for arch sm_90"):
        make_plan(cells, {"cpu": ("ubuntu-latest",), "sm_80": ("gpu",)})


def test_balance_with_history() -> None:
    rng = random.Random(7)
    cells = [c for c in synthetic(torches=("2.13.0",)) if c.arch == "sm_90"]
    history = {c.id: rng.choice([1.0, 2.0, 5.0, 30.0, 120.0]) for c in cells}
    slow = cells[17].id
    history[slow] = 5000.0
    plan = make_plan(cells, RUNNERS, max_jobs=8, history=history, target_s=1.0)
    loads = [s.expected_s for s in plan.shards]
    assert len(loads) == 8
    assert sum(loads) == pytest.approx(sum(history.values()))
    assert next(s for s in plan.shards if slow in s.cell_ids).cell_ids == (slow,)  # LPT: the giant alone
    rest = sorted(loads)[:-1]
    assert max(rest) - min(rest) <= 120.0  # no worse than one of the longest remaining cells
    without = make_plan(cells, RUNNERS, max_jobs=8, target_s=1.0)
    assert {s.cell_ids for s in without.shards} != {s.cell_ids for s in plan.shards}


def test_target_keeps_small_groups_in_one_shard() -> None:
    cells = synthetic(ops=1, torches=("2.13.0",))
    plan = make_plan(cells, RUNNERS, max_jobs=64)  # default target: 600 s of estimated work per shard
    per_group = Counter(s.name.rsplit("-", 1)[0] for s in plan.shards)
    for shard in plan.shards:
        if per_group[shard.name.rsplit("-", 1)[0]] > 1:
            assert shard.expected_s <= 600.0 * 1.5


def test_estimates_default_and_peer_median() -> None:
    cells = synthetic(ops=1, torches=("2.13.0",))
    a, b = [c for c in cells if c.arch == "cpu" and c.mode == "compile" and c.impl == "cuda"][:2]
    est = estimate(cells, {a.id: 10.0, b.id: 30.0})
    assert est[a.id] == 10.0
    other_compile = next(
        c for c in cells if c.arch == "cpu" and c.mode == "compile" and c.id not in (a.id, b.id)
    )
    assert est[other_compile.id] == 20.0  # median of its (arch, mode) peers
    gpu_eager = next(c for c in cells if c.arch == "sm_90" and c.mode == "eager")
    assert est[gpu_eager.id] == DEFAULT_ESTIMATE_S["eager"]


def test_select_globs_pick_exactly_the_shard() -> None:
    universe = synthetic(ops=3, shapes=("default", "big"))
    planned = select(universe, ["*-fp16-*", "op1.*"], ["*-export*"])
    plan = make_plan(planned, RUNNERS, universe=universe, max_jobs=12, target_s=60)
    for shard in plan.shards:
        got = [c.id for c in select(universe, shard.select)]
        assert got == sorted(shard.cell_ids), shard.name
    total_patterns = sum(len(s.select) for s in plan.shards)
    assert total_patterns < len(planned)  # compacted: fewer patterns than cells


def test_compact_select_prefers_short_prefixes() -> None:
    ids = ["a.x-pt2.13-cpu-fp32-c-eager", "a.x-pt2.13-cpu-fp32-c-compile", "a.x-pt2.13-cpu-fp16-c-eager"]
    big, other = "a.x-pt2.13-cpu-fp32-c-eager-big", "a.xy-pt2.13-cpu-fp32-c-eager"
    universe = sorted([*ids, big, other])
    assert compact_select(ids, universe) == ["a.x-pt2.13-cpu-fp16*", "a.x-pt2.13-cpu-fp32-c-compile*", ids[0]]
    assert compact_select([*ids, big], universe) == ["a.x-pt2.13*"]  # not a.x*: that would catch a.xy
    assert compact_select([ids[0], big], universe) == [ids[0] + "*"]  # the id and its -big twin
    assert compact_select(universe, universe) == ["a.x*"]


def test_gha_output_is_one_line_json_under_the_limit() -> None:
    plan = make_plan(synthetic(), RUNNERS, max_jobs=256, target_s=1.0)
    text = plan.gha_json()
    assert "\n" not in text
    assert len(text.encode()) < GHA_OUTPUT_LIMIT
    include = json.loads(text)["include"]
    assert len(include) == len(plan.shards) <= 256
    assert set(include[0]) == {"name", "runs_on", "torch", "cuda", "select", "cells", "expected_s"}
    assert sum(s["cells"] for s in include) == len(synthetic())


def test_oversized_plan_fails_clearly() -> None:
    universe = synthetic(ops=60, torches=("2.13.0",), shapes=("default", "s1", "s2"))
    planned = universe[::2]  # every other cell: nothing compacts, every id is listed
    plan = make_plan(planned, RUNNERS, universe=universe, max_jobs=256, target_s=1.0)
    with pytest.raises(UsageError, match="job output limit"):
        plan.gha_json()


def test_plan_is_deterministic() -> None:
    cells = synthetic()
    first = make_plan(cells, RUNNERS, max_jobs=30, target_s=60).gha_json()
    assert make_plan(list(reversed(cells)), RUNNERS, max_jobs=30, target_s=60).gha_json() == first


def test_manifest_roundtrip_and_missing_shards(tmp_path: Path) -> None:
    plan = make_plan(synthetic(ops=2), RUNNERS, max_jobs=8, target_s=60)
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(plan.manifest()))
    manifest = load_manifest(path)
    assert list(manifest.shards) == [s.name for s in plan.shards]
    assert manifest.cell_ids() == {i for s in plan.shards for i in s.cell_ids}
    dropped = plan.shards[2]
    assert manifest.missing_shards([s.name for s in plan.shards if s is not dropped]) == [dropped.name]
    present = manifest.cell_ids() - {dropped.cell_ids[0]}
    assert manifest.incomplete_shards(present) == [dropped.name]
    assert manifest.incomplete_shards(manifest.cell_ids()) == []
    (tmp_path / "bad.json").write_text('{"shards": []}')
    with pytest.raises(ResultsFormatError, match="manifest"):
        load_manifest(tmp_path / "bad.json")


def test_history_file_formats(tmp_path: Path) -> None:
    compat = tmp_path / "compat.json"
    compat.write_text(json.dumps({"cells": [{"id": "a", "duration_s": 3.5}, {"id": "a", "duration_s": 9.0}]}))
    assert load_history(compat) == {"a": 9.0}
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ResultsFormatError):
        load_history(broken)
    with pytest.raises(UsageError, match="no such file"):
        load_history(tmp_path / "absent.json")


def matrix_cli(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "opgate.matrix", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.integration
def test_plan_cli_writes_gha_and_manifest(tmp_path: Path) -> None:
    config = ["--config", str(DATA / "two_ops.yaml"), "--ops-path", str(DATA / "ops"), "--torch", "2.13.0"]
    listed = matrix_cli("list", *config).stdout.split()
    history = tmp_path / "compat.json"
    history.write_text(json.dumps({"cells": [{"id": i, "duration_s": 400.0} for i in listed]}))
    manifest = tmp_path / "plan" / "manifest.json"
    proc = matrix_cli(
        "plan", *config, "--max-jobs", "5", "--history", str(history), "--manifest", str(manifest)
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("\n") == 1
    include = json.loads(proc.stdout)["include"]
    assert len(include) == 5  # 400 s cells: both groups want more shards than the cap allows
    assert {tuple(s["runs_on"]) for s in include} == {
        ("ubuntu-latest",),
        ("self-hosted", "linux", "x64", "gpu-sm90"),
    }
    assert sorted(load_manifest(manifest).cell_ids()) == sorted(listed)
    bad = matrix_cli("plan", *config, "--max-jobs", "300")
    assert bad.returncode == 2
    assert "1..256" in bad.stderr


def test_plan_type_is_the_manifest_source() -> None:
    assert Plan(()).manifest() == {"manifest_version": 1, "cells": 0, "shards": []}
