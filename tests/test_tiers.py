"""The unit / integration split selects for real, and a unit test cannot cross into integration.

Planted test files run through pytest in this process (``pytester``) with the
tiers plugin: a test that starts a process without the mark fails naming the
mark to add; the same test marked ``integration`` passes; ``-m unit`` and
``-m integration`` each select their own tests and never nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]
#: the planted integration test really starts a process (inside this one)
pytestmark = pytest.mark.integration

PLANTED = """
import subprocess, sys

from pathlib import Path

import pytest


def test_pure():
    assert sum([1, 2]) == 3


def test_spawns_unmarked():
    subprocess.run([sys.executable, "-c", "pass"], check=True)


@pytest.mark.integration
def test_spawns_marked():
    subprocess.run([sys.executable, "-c", "pass"], check=True)


@pytest.mark.slow
def test_slow_is_integration():
    subprocess.run([sys.executable, "-c", "pass"], check=True)
"""


def test_a_unit_test_that_starts_a_process_fails_naming_the_mark(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_planted=PLANTED)
    result = pytester.runpytest("-p", "tests.tiers", "-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines(["*test_spawns_unmarked is a unit test but starts a process*integration*"])


@pytest.mark.parametrize(
    ("expression", "selected"),
    [
        ("unit", ["test_pure", "test_spawns_unmarked"]),  # unmarked: unit, until its guard fails it
        ("integration", ["test_spawns_marked", "test_slow_is_integration"]),
        ("not slow", ["test_pure", "test_spawns_unmarked", "test_spawns_marked"]),
    ],
)
def test_the_marks_really_select(pytester: pytest.Pytester, expression: str, selected: list[str]) -> None:
    pytester.makepyfile(test_planted=PLANTED)
    result = pytester.runpytest("-p", "tests.tiers", "-q", "--collect-only", "-m", expression)
    names = [line.split("::")[-1] for line in result.stdout.lines if "::" in line]
    assert names == selected


def test_the_files_collected_first_are_in_the_suite() -> None:
    """``conftest.LONGEST_FIRST`` names files of this suite: a renamed file would lose its place silently."""
    from tests.conftest import LONGEST_FIRST

    here = Path(__file__).parent
    assert [name for name in LONGEST_FIRST if not (here / name).is_file()] == []
