"""junit.xml validates against Jenkins' junit-10.xsd (tests/data/junit, from the xunit plugin)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from lxml import etree

from opgate.matrix.cell import Cell
from opgate.validators.junit import build_junit, write_junit
from opgate.validators.result import CellResult, CheckResult, RunResults, Verdict

XSD = Path(__file__).parent / "data" / "junit" / "junit-10.xsd"
ENV: dict[str, Any] = {
    "env_key": "pt2.13.0-cpu-triton3.8.0-py3.11",
    "torch": "2.13.0+cpu",
    "gpus": [],
    "cuda": None,
}


def _run() -> RunResults:
    cells = []
    modes = ["eager", "compile", "export", "cudagraphs", "aoti", "build", "eager"]
    for i, verdict in enumerate(Verdict):
        op = "rms_norm" if i % 2 else "silu_mul"
        cell = Cell(op, "triton", "2.13.0", "none", "cpu", "fp32", "contiguous", modes[i % 7])
        checks = [CheckResult("correctness", verdict, f'{verdict.value} <details> & "quotes"')]
        reason = "" if verdict is Verdict.PASS else f"{verdict.value}: why"
        repro = f"opgate run --select '{cell.id}' --seed {i}"
        cells.append(CellResult(cell, verdict, ENV, checks, ["k"], 1.23456789 * (i + 1), reason, i, repro))
    return RunResults(cells=cells, env=ENV, started_at="2026-12-01T00:00:00+00:00")


def _schema() -> etree.XMLSchema:
    return etree.XMLSchema(etree.parse(str(XSD)))


def test_junit_xml_validates_against_junit_10_xsd(tmp_path: Path) -> None:
    path = tmp_path / "junit.xml"
    write_junit(_run(), path)
    schema = _schema()
    doc = etree.parse(str(path))
    assert schema.validate(doc), schema.error_log
    root = doc.getroot()
    assert root.tag == "testsuites"
    assert "skipped" not in root.attrib
    # what the GitHub JUnit reporters read stays: per-suite counts, skipped included
    suites = root.findall("testsuite")
    assert sum(int(s.get("skipped")) for s in suites) == 3  # skip, unsupported, environment
    assert sum(int(s.get("tests")) for s in suites) == int(root.get("tests")) == len(Verdict)


def test_the_schema_refuses_what_junitparser_writes_by_default(tmp_path: Path) -> None:
    """The planted fault: ``skipped`` on ``<testsuites>`` (junitparser's default) fails the real XSD."""
    xml = build_junit(_run())
    xml._elem.set("skipped", "2")
    path = tmp_path / "junit.xml"
    xml.write(str(path))
    schema = _schema()
    assert not schema.validate(etree.parse(str(path)))
    assert "skipped" in str(schema.error_log)


@pytest.mark.parametrize("seconds", [0.0004, 12.3456789, 4321.98765])
def test_times_fit_the_surefire_pattern(tmp_path: Path, seconds: float) -> None:
    run = _run()
    run.cells[0].duration_s = seconds
    path = tmp_path / "junit.xml"
    write_junit(run, path)
    assert _schema().validate(etree.parse(str(path)))
