"""results.json -> junit.xml, so any CI's test-report UI shows opgate's cells as tests.

Mapping (what GitHub's JUnit reporters render): one ``<testsuite>`` per op,
one ``<testcase>`` per cell with ``classname`` = op and ``name`` = cell id (the
id every other opgate output uses).  ``fail``/``fallback``/``flaky`` are
failures (the verdict is the failure ``type``), ``error`` is an error,
``skip``/``unsupported``/``environment`` are skipped with their reason; the environment
fingerprint rides along as suite properties so merged shards stay apart.

The file validates against Jenkins' ``junit-10.xsd`` (xunit plugin), the
strictest common reader: it allows ``skipped`` on ``<testsuite>`` (where the
GitHub reporters read it) but not on ``<testsuites>``, and times with at most
three decimals (tests/test_junit_xsd.py checks it against the real schema).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

from junitparser import Error, Failure, JUnitXml, Skipped, TestCase, TestSuite

from opgate.matrix.errors import OutputError
from opgate.validators.result import CellResult, RunResults, Verdict

FAILURE_VERDICTS = frozenset({Verdict.FAIL, Verdict.FALLBACK, Verdict.FLAKY})
#: ``environment``: the mode is broken here for the reference too (the op is not blamed: not a failure).
SKIPPED_VERDICTS = frozenset({Verdict.SKIP, Verdict.UNSUPPORTED, Verdict.ENVIRONMENT})


def _message(cell: CellResult) -> str:
    if cell.reason:
        return cell.reason
    bad = [f"{c.name}: {c.summary}" for c in cell.checks if c.status.is_bad or c.status is Verdict.ERROR]
    return "; ".join(bad) or cell.verdict.value


def _details(cell: CellResult) -> str:
    """Failure body: every non-passing check, the kernels seen, and how to re-run the cell."""
    lines = [f"{c.name}: {c.status.value}: {c.summary}" for c in cell.checks if c.status is not Verdict.PASS]
    if cell.kernels:
        lines.append("kernels: " + ", ".join(cell.kernels))
    lines.append(f"attempts: {cell.attempts}  seed: {cell.seed}")
    if cell.repro:
        lines.append(f"repro: {cell.repro}")
    return "\n".join(lines)


def testcase(cell: CellResult) -> TestCase:
    case = TestCase(name=cell.id, classname=cell.cell.op, time=round(cell.duration_s, 3))
    if cell.verdict in FAILURE_VERDICTS:
        failure = Failure(_message(cell), cell.verdict.value)
        failure.text = _details(cell)
        case.result = [failure]
    elif cell.verdict is Verdict.ERROR:
        error = Error(_message(cell), "error")
        error.text = _details(cell)
        case.result = [error]
    elif cell.verdict in SKIPPED_VERDICTS:
        case.result = [Skipped(f"{cell.verdict.value}: {cell.reason}" if cell.reason else cell.verdict.value)]
    if cell.repro:
        case.system_out = cell.repro
    return case


def _property_value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def build_junit(run: RunResults) -> JUnitXml:
    xml = JUnitXml(name="opgate")
    suites: dict[str, list[TestCase]] = {}
    for cell in run.cells:
        suites.setdefault(cell.cell.op, []).append(testcase(cell))
    for op, cases in suites.items():
        suite = TestSuite(op)
        if run.started_at:
            suite.timestamp = run.started_at
        _add_properties(suite, run.env)
        suite.add_testcases(cases)  # statistics once per suite (add_testcase recounts each time)
        xml.add_testsuite(suite)
    xml.update_statistics()
    # junitparser also counts ``skipped`` on the root, which junit-10.xsd does not allow there;
    # the per-suite counts (what dorny/test-reporter and mikepenz/action-junit-report read) stay.
    xml._elem.attrib.pop("skipped", None)  # junitparser has no API that drops an attribute
    return xml


def _add_properties(suite: TestSuite, env: Mapping[str, Any]) -> None:
    for key in sorted(env):
        if env[key] is not None:
            suite.add_property(f"env.{key}", _property_value(env[key]))


def indented(xml: JUnitXml) -> bytes:
    """The document, one element per line, tab-indented, with its XML declaration.

    junitparser's ``pretty`` re-parses its own output with ``minidom`` to indent it:
    0.04 s of the 0.10 s junit.xml took for the CPU matrix's 1784 cells, written after
    the run's last cell with every lane idle.  The element tree (lxml's where
    junitparser uses lxml, else the standard library's) indents itself.
    """
    elem = xml._elem  # junitparser's element: no public accessor
    try:
        from lxml import etree as lxml_etree
    except ImportError:  # junitparser then builds the standard library's elements
        lxml_etree = None
    if lxml_etree is not None and isinstance(elem, lxml_etree._Element):
        lxml_etree.indent(elem, space="\t")
        return bytes(lxml_etree.tostring(elem, encoding="utf-8", xml_declaration=True))
    ElementTree.indent(elem, space="\t")
    return bytes(ElementTree.tostring(elem, encoding="utf-8", xml_declaration=True))


def write_junit(run: RunResults, path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(indented(build_junit(run)))
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
