"""Malformed perf inputs of ``opgate publish`` and ``opgate bench``: exit 7 naming the file and the field.

Each case mutates one field of a committed file (a bench table, the decoder block, an H200 run's
perf records, a published compat.json used as history) and runs the real ``opgate`` entry point:
the one line on stderr names the file and the case, cell or field, nothing is published, and no
traceback is printed.  Each reader also gets its real file unchanged: no false alarm.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from opgate.matrix.errors import ResultsFormatError
from opgate.reports.cli import main

RUNS = Path(__file__).resolve().parents[1] / "results" / "runs"
BENCH = RUNS / "h200-perf17" / "bench-own.json"
BLOCK = RUNS / "h200-block" / "block.json"
WORTH_RUN = RUNS / "h200-worth"  # perf points and worth-it summaries, as an H200 wrote them
CPU_RUN = RUNS / "cpu-pt2.13.0"  # re-measures none of the published perf series
PUBLISHED = Path(__file__).resolve().parents[1] / "results" / "published" / "compat.json"
EXIT = ResultsFormatError.exit_code

Mutation = Callable[[dict[str, Any]], None]


def _mutated(source: Path, target: Path, change: Mutation) -> Path:
    data = json.loads(source.read_text())
    change(data)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(data))
    return target


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str], *names: str) -> str:
    """Run ``opgate ARGV``: exit 7, one stderr line naming each of ``names``, no traceback."""
    code = main(argv)
    err = capsys.readouterr().err
    assert code == EXIT, err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    for name in names:
        assert name in err, (name, err)
    return err


# --------------------------------------------------------------------------- bench tables


def _peer(data: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = data["cases"][0]["results"]["aten"]
    assert result["role"] == "peer"
    return result


#: The first case of bench-own.json, as the message names it.
CASE0 = "cases[0] (layer_norm 4096x4096x0 bf16 forward): "
BENCH_CASES: dict[str, tuple[Mutation, str]] = {
    "peer median 0": (lambda d: _peer(d).update(median_us=0), CASE0 + "results.aten.median_us is 0"),
    "peer median null": (lambda d: _peer(d).update(median_us=None), CASE0 + "results.aten.median_us is null"),
    "pct_copy text": (lambda d: _peer(d).update(pct_copy="fast"), CASE0 + 'results.aten.pct_copy is "fast"'),
    "median NaN": (
        lambda d: _peer(d).update(median_us=float("nan")),
        CASE0 + "results.aten.median_us is NaN",
    ),
    "direction": (
        lambda d: d["cases"][0].update(direction="sideways"),
        'cases[0] (layer_norm 4096x4096x0 bf16 sideways): direction is "sideways"',
    ),
    "copy ceiling": (lambda d: d["ceilings"].update(copy_gbps="fast"), 'ceilings.copy_gbps is "fast"'),
}


@pytest.mark.parametrize("command", ["bench", "publish"])
@pytest.mark.parametrize("case", sorted(BENCH_CASES))
def test_a_bench_figure_the_table_cannot_use_is_refused(
    case: str, command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    change, field = BENCH_CASES[case]
    bad = _mutated(BENCH, tmp_path / "bench.json", change)
    out = tmp_path / "out"
    if command == "bench":
        argv = ["bench", "--in", str(bad), "--out", str(out / "bench.md")]
    else:
        argv = ["publish", "--in", str(WORTH_RUN), "--out", str(out), "--bench", str(bad)]
    _refused(argv, capsys, f"{bad}: not a benchmark document", field)
    assert not out.exists()


def test_a_real_bench_file_still_renders(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench.md"
    assert main(["bench", "--in", str(BENCH), "--out", str(out)]) == 0, capsys.readouterr().err
    assert "| 4096x4096x0 | bf16 | fwd |" in out.read_text()


# --------------------------------------------------------------------------- decoder block

BLOCK_CASES: dict[str, tuple[Mutation, str]] = {
    "forward empty": (lambda d: d["blocks"].update(forward={}), "blocks.forward is empty"),
    "alone null": (lambda d: d.update(alone=None), "alone is null"),
    "flags 1": (lambda d: d.update(flags=1), "flags is 1"),
    "median 0": (
        lambda d: d["blocks"]["forward"]["opgate/eager"].update(median_us=0),
        "blocks.forward.opgate/eager.median_us is 0",
    ),
    "alone median text": (
        lambda d: d["alone"]["rope"]["torch"].update(median_us="fast"),
        'alone.rope.torch.median_us is "fast"',
    ),
    "parity without time": (
        lambda d: d["parity_relerr"].update({"opgate/cudagraphs": 0.01}),
        "parity_relerr.opgate/cudagraphs has no time in blocks.forward",
    ),
    "flag without op": (lambda d: d.update(flags=[{"flag": "x", "mode": "eager"}]), "flags[0]"),
}


@pytest.mark.parametrize("case", sorted(BLOCK_CASES))
def test_a_block_field_the_renderers_cannot_use_is_refused(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    change, field = BLOCK_CASES[case]
    bad = _mutated(BLOCK, tmp_path / "block.json", change)
    out = tmp_path / "out"
    argv = ["publish", "--in", str(WORTH_RUN), "--out", str(out), "--block", str(bad)]
    _refused(argv, capsys, str(bad), "not a decoder-block result", field)
    assert not out.exists()


def test_the_real_block_file_still_renders(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert main(["publish", "--in", str(CPU_RUN), "--out", str(out), "--block", str(BLOCK)]) == 0
    assert "Traceback" not in capsys.readouterr().err
    assert "| opgate/eager |" in (out / "block.md").read_text()


# --------------------------------------------------------------------------- perf records of a run


def _perf_cell(data: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The first cell of the run with perf points and a worth-it summary: its id and its details."""
    for cell in data["cells"]:
        for check in cell.get("checks") or []:
            details = check.get("details") or {}
            if check["name"] == "perf" and details.get("shapes") and details.get("worth_it"):
                return cell["id"], details
    raise AssertionError("the committed run has no worth-it record")


def _set_point(key: str, value: Any) -> Mutation:
    return lambda d: _perf_cell(d)[1]["shapes"][0].update({key: value})


def _set_summary(key: str, value: Any) -> Mutation:
    return lambda d: _perf_cell(d)[1]["worth_it"]["summary"].update({key: value})


def _drop_summary(key: str) -> Mutation:
    return lambda d: _perf_cell(d)[1]["worth_it"]["summary"].pop(key)


RUN_CASES: dict[str, tuple[Mutation, str]] = {
    "samples scalar": (_set_point("samples_us", 12.5), "details.shapes[0].samples_us is 12.5"),
    "sample null": (_set_point("samples_us", [1.0, None]), "details.shapes[0].samples_us[1] is null"),
    "shape null": (_set_point("shape", [None]), "details.shapes[0].shape is [null]"),
    "median 0": (_set_point("median_us", 0), "details.shapes[0].median_us is 0"),
    "shapes object": (lambda d: _perf_cell(d)[1].update(shapes={}), "details.shapes is {}"),
    "ratio null": (_set_summary("ratio", None), "details.worth_it.summary.ratio is null"),
    "best missing": (_drop_summary("best"), "details.worth_it.summary lacks best"),
    "finding missing": (_drop_summary("finding"), "details.worth_it.summary lacks finding"),
    "finding unknown": (_set_summary("finding", "meh"), 'details.worth_it.summary.finding is "meh"'),
    "summary text": (lambda d: _perf_cell(d)[1]["worth_it"].update(summary="x"), 'summary is "x"'),
}


@pytest.mark.parametrize("case", sorted(RUN_CASES))
def test_a_malformed_perf_record_is_refused_naming_file_and_cell(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    change, field = RUN_CASES[case]
    bad = _mutated(WORTH_RUN / "results.json", tmp_path / "run" / "results.json", change)
    cell, _ = _perf_cell(json.loads((WORTH_RUN / "results.json").read_text()))
    out = tmp_path / "out"
    _refused(["publish", "--in", str(bad.parent), "--out", str(out)], capsys, str(bad), f"cell {cell}", field)
    assert not out.exists()


def test_a_real_run_with_perf_records_still_publishes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main(["publish", "--in", str(WORTH_RUN), "--out", str(out)]) == 0, capsys.readouterr().err
    assert "## Worth it?" in (out / "compat.md").read_text()
    published = json.loads((out / "compat.json").read_text())
    assert published["perf"]["series"], "the run's perf points became history"


# --------------------------------------------------------------------------- perf history


def _without_axes(data: dict[str, Any]) -> None:
    for series in data["perf"]["series"]:
        for key in ("impl", "dtype", "mode"):
            series.pop(key, None)


@pytest.mark.parametrize("change", [_without_axes, lambda d: None], ids=["without-impl-dtype-mode", "as-is"])
def test_history_series_without_the_optional_axes_still_chart(
    change: Mutation, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """compat.json's schema makes a series' impl, dtype and mode optional: the charts must too."""
    history = _mutated(PUBLISHED, tmp_path / "history.json", change)
    assert json.loads(history.read_text())["perf"]["series"]
    out = tmp_path / "out"
    code = main(["publish", "--in", str(CPU_RUN), "--out", str(out), "--history", str(history)])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "Traceback" not in err
    page = (out / "index.html").read_text()
    assert page.count('class="chart"') >= 1, "the carried-over series are charted"
