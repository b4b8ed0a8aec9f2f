"""Suite-wide fixtures.

Every test gets its own verdict cache: a ``opgate run`` inside a
test must validate for real, never be served a verdict an earlier run (or
another test) left in ``.opgate-cache``.

The longest test files are collected first (:data:`LONGEST_FIRST`): ``nox -s
tests`` hands whole files to the xdist workers in collection order
(``--dist loadfile --no-loadscope-reorder``; xdist's own order is by number of
tests, which put the 2-test, 50 s wheel test among the last files), so a long
file collected last would run alone at the end.
"""

from __future__ import annotations

from pathlib import Path

import pytest

# the harness hands its CUDA build to the payload (opgate.ops._extension): tests that import a
# first-party op directly get the build a run would use
import opgate.validators  # noqa: F401

#: the unit / integration tiers and the guard that keeps unit tests in one process
pytest_plugins = ["tests.tiers"]


#: The test files that take longest (2 cores, no coverage: 85 s down to 17 s), longest first; every
#: other file keeps its place after them.  Only the order changes: a file missing here costs
#: time, not tests.
LONGEST_FIRST: tuple[str, ...] = (
    "test_zoo.py",
    "test_zoo_export.py",
    "test_zoo_compile.py",
    "test_wheel.py",
    "test_warmserver.py",
    "test_runner_robust.py",
    "test_forkserver.py",
    "test_runner_isolation.py",
    "test_fanout_e2e.py",
    "test_controls.py",  # its module fixture: 31 s of a cold run, 12 s warm
    "test_alerts_faults.py",
    "test_tolerance_seeds.py",
    "test_runner_cache.py",
    "test_nox_sessions.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


@pytest.fixture(autouse=True)
def _private_verdict_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path_factory.mktemp("opgate-cache")
    monkeypatch.setenv("OPGATE_CACHE", str(cache))
    return cache
