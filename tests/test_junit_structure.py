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
