"""``opgate compact``: the committed form of a run reads back the same verdicts, tables and history.

Checked on a run the validators really wrote (tests/data/reports/validators-cpu:
a pass with full comparison details and a trace path, an error, a skip) and on
the reports fixtures (a failing check, perf samples): compact drops what no
reader needs and nothing a reader does.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from opgate.matrix.errors import ResultsFormatError
from opgate.reports.publish import publish
from opgate.validators.breakdown import breakdown
from opgate.validators.compact import compact_runs
from opgate.validators.result import RunResults, Verdict, compact_check
from tests.data.reports.fixtures import FAIL_CELL, PERF_CELL, cpu_run, gpu_run, write_run

ROOT = Path(__file__).resolve().parents[1]
REAL_RUN = ROOT / "tests" / "data" / "reports" / "validators-cpu"


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


@pytest.fixture
def runs(tmp_path: Path) -> dict[str, Path]:
    real = tmp_path / "full" / "cpu-real"
    shutil.copytree(REAL_RUN, real)
    (real / "junit.xml").write_text("<testsuites/>")
    (real / "run.json").write_text(json.dumps({"timings": {"wall_s": 9.0}, "workers": []}))
    (real / "cells").mkdir()
    return {
        "real": real,
        "cpu": write_run(cpu_run(), tmp_path / "full" / "cpu"),
        "gpu": write_run(gpu_run(), tmp_path / "full" / "gpu"),
    }


def test_compact_keeps_every_verdict_and_drops_what_no_reader_needs(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    done = compact_runs(list(runs.values()), tmp_path / "kept")
    assert [d.dest.name for d in done] == ["cpu-real", "cpu", "gpu"]
    for name, source in runs.items():
        full, kept = (
            RunResults.read(source / "results.json"),
            RunResults.read(tmp_path / "kept" / source.name / "results.json"),
        )
        assert [(c.id, c.verdict, c.reason, c.kernels, c.repro, c.seed) for c in kept.cells] == [
            (c.id, c.verdict, c.reason, c.kernels, c.repro, c.seed) for c in full.cells
        ], name
        assert [c.env for c in kept.cells] == [c.env for c in full.cells], "the run's env is put back"
        assert [[(k.name, k.status, k.summary, k.duration_s) for k in c.checks] for c in kept.cells] == [
            [(k.name, k.status, k.summary, k.duration_s) for k in c.checks] for c in full.cells
        ]
    real_dir = tmp_path / "kept" / "cpu-real"
    assert sorted(p.name for p in real_dir.iterdir()) == [
        "results.json",
        "run.json",
    ]  # no junit, cells/, traces
    text = (real_dir / "results.json").read_text()
    assert '"trace"' not in text
    assert '"comparisons"' not in text  # the passing cell's comparisons: its summary says the worst
    assert len(lines(real_dir / "results.json")) == 2 + 3, "one cell per line"
    assert done[0].bytes_after < done[0].bytes_before / 2


def test_red_checks_and_perf_keep_their_details(runs: dict[str, Path], tmp_path: Path) -> None:
    compact_runs([runs["cpu"], runs["gpu"]], tmp_path / "kept")
    cpu = {c.id: c for c in RunResults.read(tmp_path / "kept" / "cpu" / "results.json").cells}
    assert cpu[FAIL_CELL].check("correctness").details["max_abs_err"] == 0.31  # type: ignore[union-attr]
    gpu = {c.id: c for c in RunResults.read(tmp_path / "kept" / "gpu" / "results.json").cells}
    assert gpu[PERF_CELL].check("perf").details["points"][0]["samples_us"]  # type: ignore[union-attr]
    assert all(not k.details for c in gpu.values() for k in c.checks if k.name != "perf")


def test_a_rerun_record_is_compacted_inside() -> None:
    attempt = {
        "name": "attempt_2",
        "status": "fail",
        "summary": "gradients: too far",
        "details": {
            "reason": "gradients: too far",
            "checks": [
                {
                    "name": "correctness",
                    "status": "pass",
                    "summary": "ok",
                    "details": {"comparisons": [1, 2]},
                },
                {
                    "name": "evidence",
                    "status": "fallback",
                    "summary": "copy",
                    "details": {"copies": ["c"], "trace": "t.json"},
                },
            ],
        },
    }
    kept = compact_check(attempt)
    assert kept["details"]["checks"] == [
        {"name": "correctness", "status": "pass", "summary": "ok"},
        {"name": "evidence", "status": "fallback", "summary": "copy", "details": {"copies": ["c"]}},
    ]


def test_publish_reads_the_same_from_either_form(
    runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1767225600")  # both publishes stamped alike
    compact_runs([runs["cpu"], runs["gpu"]], tmp_path / "kept")
    full = publish([runs["cpu"], runs["gpu"]], tmp_path / "pub-full")
    kept = publish([tmp_path / "kept" / "cpu", tmp_path / "kept" / "gpu"], tmp_path / "pub-kept")
    assert full.to_json()["cells"] == kept.to_json()["cells"]
    assert full.perf == kept.perf
    assert (tmp_path / "pub-full" / "compat.md").read_text() == (
        tmp_path / "pub-kept" / "compat.md"
    ).read_text()


def test_the_time_breakdown_reads_the_same(runs: dict[str, Path], tmp_path: Path) -> None:
    compact_runs([runs["real"]], tmp_path / "kept")
    run = json.loads((runs["real"] / "run.json").read_text())
    cells = json.loads((runs["real"] / "results.json").read_text())["cells"]
    kept = json.loads((tmp_path / "kept" / "cpu-real" / "results.json").read_text())["cells"]
    assert breakdown(kept, run) == breakdown(cells, run)


def test_in_place_and_twice_is_the_same(runs: dict[str, Path], tmp_path: Path) -> None:
    compact_runs([runs["cpu"]], runs["cpu"].parent)
    first = (runs["cpu"] / "results.json").read_bytes()
    compact_runs([runs["cpu"]], runs["cpu"].parent)
    assert (runs["cpu"] / "results.json").read_bytes() == first
    assert RunResults.read(runs["cpu"] / "results.json").cells[0].verdict in set(Verdict)


def test_refusals_name_the_folder(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ResultsFormatError, match=r"empty/results\.json: no results file"):
        compact_runs([tmp_path / "empty"], tmp_path / "kept")
    for side in ("a", "b"):
        write_run(cpu_run(), tmp_path / side / "run")
    with pytest.raises(ResultsFormatError, match="share a name"):
        compact_runs([tmp_path / "a" / "run", tmp_path / "b" / "run"], tmp_path / "kept")
    assert not (tmp_path / "kept").exists(), "nothing written when any source is refused"


@pytest.mark.integration
def test_the_command(runs: dict[str, Path], tmp_path: Path) -> None:
    argv = [
        sys.executable,
        "-m",
        "opgate.reports.cli",
        "compact",
        str(runs["real"]),
        "--into",
        str(tmp_path / "k"),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "3 cells, results.json" in done.stdout
    missing = subprocess.run(
        [*argv[:4], str(tmp_path / "nope"), "--into", str(tmp_path / "k")],
        capture_output=True, text=True, check=False, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert missing.returncode == ResultsFormatError.exit_code
    assert missing.stderr.count("\n") == 1
    assert "nope/results.json" in missing.stderr
