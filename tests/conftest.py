"""Suite-wide fixtures.

Every test gets its own verdict cache: a ``opgate run`` inside a
test must validate for real, never be served a verdict an earlier run (or
another test) left in ``.opgate-cache``.
"""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _private_verdict_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path_factory.mktemp("opgate-cache")
    monkeypatch.setenv("OPGATE_CACHE", str(cache))
    return cache
