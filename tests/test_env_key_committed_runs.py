"""Writer and readers agree on the environment key of every committed run.

The runs under results/runs/ were written by real validator runs (CPU runners,
an H200).  Each results.json records the key its writer computed; the reports
read the same record back with the one :class:`Fingerprint` type, merge on its
key and publish it: all three must be the same string, for every cell of every
committed run, and the published compat.json must carry exactly those keys.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opgate.reports import compat
from opgate.reports.merge import merge, read_runs
from opgate.validators.env import Fingerprint, env_key
from opgate.validators.result import RunResults

ROOT = Path(__file__).resolve().parents[1]
RUNS = sorted(p.parent for p in (ROOT / "results" / "runs").glob("*/results.json"))
PUBLISHED = ROOT / "results" / "published" / "compat.json"


def test_there_are_committed_runs_from_cpu_and_gpu_machines() -> None:
    names = {p.name for p in RUNS}
    assert any(n.startswith("cpu-") for n in names)
    assert any(n.startswith("h200-") for n in names)


@pytest.mark.parametrize("run_dir", RUNS, ids=lambda p: p.name)
def test_recorded_key_equals_the_readers_key(run_dir: Path) -> None:
    raw = json.loads((run_dir / "results.json").read_text())
    written = raw["env"]["env_key"]
    assert Fingerprint.from_json(raw["env"]).key == written
    assert env_key(raw["env"]) == written
    for cell in raw["cells"]:
        record = cell.get("env") or raw["env"]
        assert Fingerprint.from_json(record).key == record.get("env_key", written)
    merged = merge([(run_dir / "results.json", RunResults.read(run_dir / "results.json"))])
    assert set(merged.environments) == {written}
    assert {e.env_key for e in merged.entries} == {written}


def test_gpu_runs_are_keyed_by_the_gpu_and_cpu_runs_are_not() -> None:
    keys = {p.name: json.loads((p / "results.json").read_text())["env"]["env_key"] for p in RUNS}
    for name, key in keys.items():
        if name.startswith("h200-"):
            assert "-H200-sm_90-" in key, (name, key)
            assert "-cu13.0-" not in key, "the CUDA build is in torch's +cu130, said once"
        else:
            assert "-cpu-" in key, (name, key)


def test_published_matrix_uses_the_same_keys_as_its_runs() -> None:
    """Every published key is one a committed run was keyed by.

    Runs are merged one by one: committed runs of one environment taken with
    different opgate code (Liger before and after a fix) disagree on some
    verdicts, and a merge refuses that; the README's publish commands pick one.
    """
    doc = compat.load(PUBLISHED)
    run_keys = {key for run in RUNS for key in merge(read_runs([run])).environments}
    published = {e.env_key for e in doc.entries}
    assert published <= run_keys
    for key, record in doc.environments.items():
        assert Fingerprint.from_json(record).key == key
