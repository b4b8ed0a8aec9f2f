"""The planted-fault zoo exported and AOT-compiled: the export and aoti cases of ``tests/zoo_cases.py``.

export cells run the exported program (and its decomposed form), aoti cells an
AOTInductor package compiled, loaded and run, for real.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.zoo_cases import Case, assert_case, cpu_cases

EXPORTED = cpu_cases("export", "aoti")


@pytest.mark.slow
@pytest.mark.parametrize("case", EXPORTED, ids=[c.cell_id for c in EXPORTED])
def test_zoo_verdict(case: Case, tmp_path: Path) -> None:
    assert_case(case, tmp_path)
