"""Bad input to the torch-free commands: a clear error with its exit code, nothing lost, no traceback.

Each case is one a user can type or feed by mistake (a percentage where a
fraction is asked, a ``v`` before a version, a truncated run among good ones,
a folder where a published file goes, an old ``SOURCE_DATE_EPOCH``); each is
run through the ``opgate`` command's entry point on real files, and what was
there before the command is checked to be there after it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from opgate.reports.cli import main as opgate
from tests.data.reports.fixtures import cpu_run, publish_pair, write_run

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).parent / "data" / "config"
SMALL = ["--config", str(DATA / "two_ops.yaml"), "--ops-path", str(DATA / "ops")]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """``opgate ARGV`` in this process: its exit code and stderr."""
    capsys.readouterr()
    code = opgate(list(argv))
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


def digests(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return publish_pair(tmp_path_factory.mktemp("pair"))


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("--alpha", "5", "a significance level is between 0 and 1"),
        ("--alpha", "nan", "a significance level is between 0 and 1"),
        ("--min-effect", "5", "0.05 = 5%"),
        ("--min-effect", "-3", "0.05 = 5%"),
        ("--max-bytes", "-5", "between 4096 and"),
    ],
)
def test_diff_refuses_a_perf_rule_or_budget_out_of_range(
    pair: tuple[Path, Path], capsys: pytest.CaptureFixture[str], option: str, value: str, says: str
) -> None:
    """``--min-effect 5`` meant as 5% would be 500%: every perf regression hidden, exit 0."""
    base, head = pair
    code, err = run(capsys, "diff", "--base", str(base), "--head", str(head), option, value)
    assert code == 2
    assert says in err
    code, _ = run(capsys, "diff", "--base", str(base), "--head", str(head), "--min-effect", "0.05")
    assert code == 0  # a fraction, as documented


@pytest.mark.parametrize(
    ("torches", "says"),
    [
        (["v2.13"], "--torch 'v2.13': not a torch version"),
        ([""], "--torch '': not a torch version"),
        (["2.13.0", "2.13.1"], "share the id column pt2.13"),
    ],
)
def test_list_refuses_a_torch_version_that_would_name_cells_wrongly(
    capsys: pytest.CaptureFixture[str], torches: list[str], says: str
) -> None:
    flags = [arg for version in torches for arg in ("--torch", version)]
    code, err = run(capsys, "list", *SMALL, *flags)
    assert code == 2
    assert says in err
    code, _ = run(capsys, "list", *SMALL, "--torch", "2.13.0", "--torch", "2.14.1+cu130")
    assert code == 0


@pytest.mark.parametrize("duration", ["NaN", "Infinity", "1e308", "-5"])
def test_plan_refuses_a_history_whose_durations_are_not_durations(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], duration: str
) -> None:
    cell = run_ids(capsys)[0]
    history = tmp_path / "history.json"
    history.write_text('{"cells": [{"id": "%s", "duration_s": %s}]}' % (cell, duration))  # noqa: UP031 - raw JSON tokens
    code, err = run(capsys, "plan", *SMALL, "--torch", "2.13.0", "--history", str(history))
    assert code == 7
    assert f"--history {history}" in err
    assert "duration_s" in err


def run_ids(capsys: pytest.CaptureFixture[str]) -> list[str]:
    code = opgate(["list", *SMALL, "--torch", "2.13.0"])
    assert code == 0
    return capsys.readouterr().out.split()


@pytest.mark.parametrize("target", ["1e-320", "0", "nan"])
def test_plan_refuses_a_target_that_is_not_a_job_length(
    capsys: pytest.CaptureFixture[str], target: str
) -> None:
    code, err = run(capsys, "plan", *SMALL, "--torch", "2.13.0", "--target-s", target)
    assert code == 2
    assert "seconds per job" in err


def test_compact_reads_every_run_before_it_rewrites_any(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A truncated run among good ones: exit 7 naming it, and the good run, already in ``--into``,
    is left as it was (it used to be compacted in place before the bad one was read)."""
    good = write_run(cpu_run(), tmp_path / "runs" / "good")
    bad = tmp_path / "runs" / "bad"
    bad.mkdir()
    (bad / "results.json").write_text('{"schema_version": 1, "cells": [')
    before = digests(tmp_path / "runs")
    code, err = run(capsys, "compact", str(good), str(bad), "--into", str(tmp_path / "runs"))
    assert code == 7
    assert str(bad / "results.json") in err
    assert digests(tmp_path / "runs") == before
    code, _ = run(capsys, "compact", str(good), "--into", str(tmp_path / "runs"))
    assert code == 0
    assert digests(tmp_path / "runs") != before  # compacted once every source read
    assert not list((tmp_path / "runs").rglob(".results.json.compact"))


def test_publish_into_a_folder_whose_file_is_a_folder_replaces_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = write_run(cpu_run(), tmp_path / "run")
    out = tmp_path / "pub"
    assert run(capsys, "publish", "--in", str(run_dir), "--out", str(out))[0] == 0
    (out / "compat.md").unlink()
    (out / "compat.md").mkdir()
    before = digests(out)
    code, err = run(capsys, "publish", "--in", str(run_dir), "--out", str(out))
    assert code == 2
    assert "compat.md there is a folder" in err
    assert digests(out) == before  # compat.json was not replaced first


@pytest.mark.parametrize("epoch", ["abc", "99999999999999", "-1"])
def test_publish_refuses_a_source_date_epoch_that_is_not_a_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, epoch: str
) -> None:
    run_dir = write_run(cpu_run(), tmp_path / "run")
    monkeypatch.setenv("SOURCE_DATE_EPOCH", epoch)
    code, err = run(capsys, "publish", "--in", str(run_dir), "--out", str(tmp_path / "pub"))
    assert code == 2
    assert f"SOURCE_DATE_EPOCH={epoch!r}" in err
    assert not (tmp_path / "pub").exists()
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1764900000")
    assert run(capsys, "publish", "--in", str(run_dir), "--out", str(tmp_path / "pub"))[0] == 0
    assert (
        json.loads((tmp_path / "pub" / "compat.json").read_text())["generated_at"] == "2025-12-05T02:00:00Z"
    )


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("torch", 2.13, "fingerprint field 'torch': a string, got 2.13"),
        ("nvcc", "13.0", "fingerprint field 'nvcc': an object of CUDA release -> nvcc path strings"),
        ("gpus", 1, "fingerprint field 'gpus': a list of GPU objects"),
        ("cpu_count", True, "fingerprint field 'cpu_count': an integer"),
    ],
)
def test_a_fingerprint_field_of_the_wrong_type_is_a_format_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str, value: object, says: str
) -> None:
    run_dir = write_run(cpu_run(), tmp_path / "run")
    doc = json.loads((run_dir / "results.json").read_text())
    for record in [doc, *doc["cells"]]:  # the run's and each cell's own (a compact run keeps the run's)
        if "env" in record:
            record["env"][field] = value
    (run_dir / "results.json").write_text(json.dumps(doc))
    code, err = run(capsys, "publish", "--in", str(run_dir), "--out", str(tmp_path / "pub"))
    assert code == 7
    assert str(run_dir / "results.json") in err
    assert says in err


def test_a_compat_environment_of_the_wrong_type_is_a_format_error_in_diff_and_history(
    pair: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base, head = pair
    doc = json.loads(base.read_text())
    next(iter(doc["environments"].values()))["nvcc"] = "13.0"
    broken = tmp_path / "compat.json"
    broken.write_text(json.dumps(doc))
    code, err = run(capsys, "diff", "--base", str(broken), "--head", str(head))
    assert code == 7
    assert f"{broken}: environments/" in err
    run_dir = write_run(cpu_run(), tmp_path / "run")
    code, err = run(
        capsys, "publish", "--in", str(run_dir), "--out", str(tmp_path / "pub"), "--history", str(broken)
    )
    assert code == 7
    assert not (tmp_path / "pub").exists()


def test_collect_of_a_folder_that_does_not_exist_makes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = run(capsys, "collect", "--out", str(tmp_path / "typo"))
    assert code == 2
    assert "no such run folder" in err
    assert not (tmp_path / "typo").exists()


@pytest.mark.parametrize("name", ["cpu-pt2.13.0", "h200-sm_90-matrix", "h200-liger-8", "h200-bitsandbytes"])
def test_the_committed_runs_still_publish(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str
) -> None:
    """No false alarm: the type checks accept the fingerprints opgate wrote, on CPU and on the H200."""
    code, err = run(
        capsys, "publish", "--in", str(ROOT / "results" / "runs" / name), "--out", str(tmp_path / "p")
    )
    assert code == 0, err
