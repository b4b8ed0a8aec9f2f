"""compat.json: schema validity, round trip, history, and the schema staying in step with the code."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from opgate.matrix.cell import AXES
from opgate.matrix.errors import ResultsFormatError
from opgate.reports import compat
from opgate.reports.perf import SAMPLES_KEPT
from opgate.reports.publish import publish
from opgate.validators.result import Verdict, compact_record
from tests.data.reports.fixtures import PERF_CELL, cpu_run, gpu_run, write_run


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pub")
    publish([write_run(cpu_run(), root / "cpu"), write_run(gpu_run(), root / "gpu")], root / "out")
    return root / "out" / "compat.json"


def test_compat_json_validates_against_the_published_schema(published: Path) -> None:
    doc = json.loads(published.read_text())
    schema = json.loads(compat.COMPAT_SCHEMA_FILE.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(doc)
    assert schema["$id"].endswith(":1")
    assert doc["schema"] == schema["$id"]
    assert doc["schema_version"] == 1


def test_schema_tracks_the_result_vocabulary() -> None:
    schema = json.loads(compat.COMPAT_SCHEMA_FILE.read_text())
    assert set(schema["$defs"]["verdict"]["enum"]) == {v.value for v in Verdict}
    assert tuple(schema["$defs"]["cell"]["properties"]["axes"]["required"]) == AXES


def test_round_trip_keeps_every_record(published: Path) -> None:
    doc = json.loads(published.read_text())
    loaded = compat.load(published)
    expected = len(cpu_run().cells) + len(gpu_run().cells)
    assert len(loaded.entries) == len(doc["cells"]) == expected
    first, result = doc["cells"][0], loaded.entries[0].result
    # on disk, the compact record: the environment once under environments, not on every cell
    assert "env" not in first
    assert result.env == doc["environments"][first["env_key"]]
    assert {k: v for k, v in first.items() if k != "env_key"} == compact_record(result.to_json(), result.env)
    assert loaded.to_json()["cells"] == doc["cells"]
    assert set(doc["environments"]) == {e.env_key for e in loaded.entries}


@pytest.mark.parametrize(
    ("mutate", "where"),
    [
        (lambda d: d["cells"][3].update(verdict="passed"), "at cells/3/verdict"),
        (lambda d: d["cells"][0]["axes"].pop("mode"), "at cells/0/axes"),
        (lambda d: d.pop("environments"), "at (top level)"),
        (
            lambda d: d["perf"]["series"][0]["runs"][0].update(median_us=-1),
            "at perf/series/0/runs/0/median_us",
        ),
    ],
)
def test_invalid_documents_name_the_json_path(
    published: Path, tmp_path: Path, mutate: Any, where: str
) -> None:
    doc = json.loads(published.read_text())
    mutate(doc)
    bad = tmp_path / "compat.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(ResultsFormatError, match=re.escape(where)) as info:
        compat.load(bad)
    assert str(bad) in str(info.value)


def test_other_schema_version_is_refused(published: Path, tmp_path: Path) -> None:
    doc = json.loads(published.read_text())
    doc["schema_version"] = 2
    (tmp_path / "c.json").write_text(json.dumps(doc))
    with pytest.raises(ResultsFormatError, match="schema_version 2, this opgate reads 1"):
        compat.load(tmp_path / "c.json")


def perf_runs(path: Path, shape: str) -> list[dict[str, Any]]:
    doc = json.loads(path.read_text())
    series = next(s for s in doc["perf"]["series"] if s["cell"] == PERF_CELL and s["shape"] == shape)
    runs: list[dict[str, Any]] = series["runs"]
    return runs


def test_perf_history_accumulates_and_prunes_samples(tmp_path: Path) -> None:
    cpu = write_run(cpu_run(), tmp_path / "cpu")
    previous = None
    for i in range(SAMPLES_KEPT + 2):
        gpu = write_run(gpu_run(slowdown=1.0 + i / 100, seed=i), tmp_path / f"gpu{i}")
        out = tmp_path / f"out{i}"
        publish([cpu, gpu], out, history=previous)
        previous = out / "compat.json"
    assert previous is not None
    runs = perf_runs(previous, "32768x8192")
    assert len(runs) == SAMPLES_KEPT + 2
    assert [("samples_us" in r) for r in runs] == [False, False] + [True] * SAMPLES_KEPT
    assert runs[-1]["median_us"] > runs[0]["median_us"]  # the planted 1%-per-run drift is kept in order
    assert {"gbps", "roofline_pct", "iqr_us", "baseline"} <= set(runs[-1])
    assert {r["run"] for r in runs} == {"2026-11-30T11:04:00Z"}  # labelled by the run, not the publish


def test_history_survives_a_run_without_perf(tmp_path: Path) -> None:
    first = tmp_path / "a"
    publish([write_run(cpu_run(), tmp_path / "cpu"), write_run(gpu_run(), tmp_path / "gpu")], first)
    second = tmp_path / "b"
    publish([tmp_path / "cpu"], second, history=first / "compat.json")  # a CPU-only night
    doc = json.loads((second / "compat.json").read_text())
    assert len(perf_runs(second / "compat.json", "4096x4096")) == 1
    gpu_keys = {s["env_key"] for s in doc["perf"]["series"]}
    assert gpu_keys <= set(doc["environments"])  # the H200 fingerprint stays with its history


def test_validation_on_write(published: Path) -> None:
    loaded = compat.load(published)
    broken = copy.deepcopy(loaded)
    broken.generated_at = "yesterday"
    with pytest.raises(ResultsFormatError, match="generated_at"):
        compat.dumps(broken)
