"""Suite-wide fixtures.

Every test gets its own verdict cache: a ``opgate run`` inside a
test must validate for real, never be served a verdict an earlier run (or
another test) left in ``.opgate-cache``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

# the harness hands its CUDA build to the payload (opgate.ops._extension): tests that import a
# first-party op directly get the build a run would use
import opgate.validators  # noqa: F401

#: the unit / integration tiers and the guard that keeps unit tests in one process
pytest_plugins = ["tests.tiers"]


@pytest.fixture(autouse=True)
def _private_verdict_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path_factory.mktemp("opgate-cache")
    monkeypatch.setenv("OPGATE_CACHE", str(cache))
    return cache
