"""junit.xml parsed back with junitparser: one suite per op, one case per cell, verdict mapping."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from junitparser import Error, Failure, JUnitXml, Skipped

from opgate.matrix.cell import Cell
from opgate.validators.junit import write_junit
from opgate.validators.result import CellResult, CheckResult, RunResults, Verdict

ENV: dict[str, Any] = {
    "env_key": "pt2.13.0-cpu-triton3.8.0-py3.11",
    "torch": "2.13.0+cpu",
    "gpus": [],
    "gpu_name": None,
}


def result(
    op: str, dtype: str, verdict: Verdict, reason: str = "", checks: list[CheckResult] | None = None
) -> CellResult:
    c = Cell(op, "triton", "2.13.0+cpu", "none", "cpu", dtype, "contiguous", "eager")
    return CellResult(
        c,
        verdict,
        ENV,
        checks or [],
        ["k1"],
        1.25,
        reason,
        seed=7,
        repro=f"opgate run --select '{c.id}'",
    )


def test_junit_round_trip(tmp_path: Path) -> None:
    cells = [
        result("rms_norm", "fp32", Verdict.PASS),
        result(
            "rms_norm",
            "fp16",
            Verdict.FAIL,
            checks=[CheckResult("correctness", Verdict.FAIL, "max err 3e-2")],
        ),
        result("rms_norm", "bf16", Verdict.ERROR, "worker killed by SIGSEGV"),
        result(
            "matmul",
            "fp32",
            Verdict.FALLBACK,
            checks=[CheckResult("evidence", Verdict.FALLBACK, "aten::mm ran")],
        ),
        result("matmul", "fp16", Verdict.FLAKY, "flaky: attempt 1 fail (x); attempt 2 pass"),
        result("matmul", "bf16", Verdict.SKIP, "no sm_90 device here"),
        result("sdpa", "fp32", Verdict.UNSUPPORTED, "declared: fp32 not supported"),
    ]
    run = RunResults(cells=cells, env=ENV, started_at="2026-11-30T00:00:00+00:00")
    path = tmp_path / "junit.xml"
    write_junit(run, path)

    xml = JUnitXml.fromfile(str(path))
    suites = {s.name: s for s in xml}
    assert list(suites) == ["rms_norm", "matmul", "sdpa"]
    rms = suites["rms_norm"]
    assert (rms.tests, rms.failures, rms.errors, rms.skipped) == (3, 1, 1, 0)
    assert (suites["matmul"].tests, suites["matmul"].failures, suites["matmul"].skipped) == (3, 2, 1)
    props = {p.name: p.value for p in rms.properties()}
    assert props["env.env_key"] == ENV["env_key"]
    assert props["env.gpus"] == "[]"
    assert "env.gpu_name" not in props

    cases = {case.name: case for suite in xml for case in suite}
    assert set(cases) == {c.id for c in cells}
    for c in cells:
        case = cases[c.id]
        assert case.classname == c.cell.op
        assert case.time == 1.25
    by = {c.verdict: cases[c.id] for c in cells}
    assert by[Verdict.PASS].is_passed
    fail = by[Verdict.FAIL].result[0]
    assert isinstance(fail, Failure)
    assert (fail.type, fail.message) == ("fail", "correctness: max err 3e-2")
    assert "repro: opgate run" in fail.text
    assert isinstance(by[Verdict.FALLBACK].result[0], Failure)
    assert by[Verdict.FALLBACK].result[0].type == "fallback"
    assert by[Verdict.FLAKY].result[0].type == "flaky"
    err = by[Verdict.ERROR].result[0]
    assert isinstance(err, Error)
    assert err.message == "worker killed by SIGSEGV"
    skip = by[Verdict.SKIP].result[0]
    assert isinstance(skip, Skipped)
    assert skip.message == "skip: no sm_90 device here"
    assert by[Verdict.UNSUPPORTED].result[0].message == "unsupported: declared: fp32 not supported"


def test_empty_run_writes_a_valid_file(tmp_path: Path) -> None:
    path = tmp_path / "junit.xml"
    write_junit(RunResults(cells=[], env=ENV), path)
    assert JUnitXml.fromfile(str(path)).tests == 0


def test_indented_writes_either_element_tree_one_element_per_line() -> None:
    """junitparser builds lxml's elements where lxml is installed, else the standard library's."""
    from types import SimpleNamespace
    from xml.etree import ElementTree

    from opgate.validators.junit import indented

    root = ElementTree.Element("testsuites", name="opgate")
    ElementTree.SubElement(ElementTree.SubElement(root, "testsuite", name="rope"), "testcase", name="c1")
    text = indented(SimpleNamespace(_elem=root)).decode()  # type: ignore[arg-type]
    assert text.splitlines() == [
        "<?xml version='1.0' encoding='utf-8'?>",
        '<testsuites name="opgate">',
        '\t<testsuite name="rope">',
        '\t\t<testcase name="c1" />',
        "\t</testsuite>",
        "</testsuites>",
    ]


def test_a_results_line_encoded_when_the_cell_was_stored_is_written_as_it_was(tmp_path: Path) -> None:
    """The run encodes each cell once; results.json takes that line while the cell is the same record."""
    import json

    from opgate.validators.result import encode_record

    kept, replaced = result("rope", "fp32", Verdict.PASS), result("rope", "fp16", Verdict.PASS)
    stale = result("rope", "fp16", Verdict.FAIL, "an earlier record of the cell")
    kept_line = encode_record({**kept.to_json(), "reason": "as stored"})  # tells the line apart
    encoded = {kept.id: (kept, kept_line), replaced.id: (stale, encode_record(stale.to_json()))}
    run = RunResults(cells=[kept, replaced], env=ENV)
    run.write(tmp_path / "results.json", encoded=encoded)
    lines = (tmp_path / "results.json").read_text().splitlines()
    assert kept_line + "," in lines
    assert encode_record(replaced.to_json()) in lines  # the record changed since: encoded afresh
    back = RunResults.read(tmp_path / "results.json")
    assert [(c.id, c.verdict, c.reason) for c in back.cells] == [
        (kept.id, Verdict.PASS, "as stored"),
        (replaced.id, Verdict.PASS, ""),
    ]
    assert json.loads((tmp_path / "results.json").read_text())["cells"][1] == replaced.to_json()
