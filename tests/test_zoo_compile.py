"""The planted-fault zoo under ``torch.compile``: the compile cases of ``tests/zoo_cases.py``.

Each cell compiles the op inside its producer/consumer graph with Inductor, for
real; the cases and what they prove are described in the table.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.zoo.harness import make_cell
from tests.zoo_cases import Case, assert_case, check_of, cpu_cases, outcome_of

COMPILE = cpu_cases("compile")


@pytest.mark.slow
@pytest.mark.parametrize("case", COMPILE, ids=[c.cell_id for c in COMPILE])
def test_zoo_verdict(case: Case, tmp_path: Path) -> None:
    assert_case(case, tmp_path)


@pytest.mark.slow
def test_cia_evidence_names_what_ran_instead(tmp_path: Path) -> None:
    _, outcome = outcome_of(make_cell("zoo_cia", "fp32", "contiguous", "compile"), tmp_path)
    ev = check_of(outcome, "evidence")
    assert ev.details["missing"] == ["zoo::cia_rms_norm"]
    assert any("cpp_fused" in n for n in ev.details["seen"])
    opcheck = [c for c in outcome.checks if c.name.startswith("opcheck")]
    assert not opcheck  # opcheck belongs to eager cells, where it passes this op (see zoo_cia eager cases)


@pytest.mark.slow
def test_compile_counts_breaks_and_recompiles(tmp_path: Path) -> None:
    _, broken = outcome_of(make_cell("zoo_graph_break", "fp32", "contiguous", "compile"), tmp_path)
    details = check_of(broken, "compile").details
    assert details["graph_breaks"] == 1
    assert "Tensor.item()" in details["break_reasons"][0]
    _, special = outcome_of(make_cell("zoo_specializes", "fp32", "contiguous", "compile"), tmp_path)
    details = check_of(special, "compile").details
    assert details["recompiles"] == 1
    assert [g["new_graphs"] for g in details["graphs"]] == [1, 1]
    _, good = outcome_of(make_cell("zoo_good", "fp32", "contiguous", "compile"), tmp_path)
    assert check_of(good, "compile").details["recompiles"] == 0
