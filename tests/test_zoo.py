"""The planted-fault zoo in eager cells: each fault gets the right verdict from the right check, in its cells.

The verdict table is ``tests/zoo_cases.py`` (its compile, export and aoti cases
run in ``tests/test_zoo_compile.py`` and ``tests/test_zoo_export.py``).  Native
crashes (segfault, hang) kill the process, so they go through the real runner
in a subprocess.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.zoo.harness import ZOO, make_cell
from tests.zoo_cases import (
    CPU_CASES,
    SEED_INDEPENDENT,
    STABILITY,
    Case,
    assert_case,
    check_of,
    cpu_cases,
    outcome_of,
)

REPO = Path(__file__).resolve().parent.parent
#: torch 2.11's error for a wrap_triton kernel called without its defaulted constexpr
LAUNCHER = "launcher() missing 1 required positional argument: '_grid_2'"
EAGER = cpu_cases("eager")


def test_each_cpu_case_runs_in_one_zoo_file() -> None:
    """The three zoo files run every CPU case of the table once: a case in a new mode needs a file."""
    from tests.test_zoo_compile import COMPILE
    from tests.test_zoo_export import EXPORTED

    ran = [c.cell_id for c in (*EAGER, *COMPILE, *EXPORTED)]
    assert sorted(ran) == sorted(c.cell_id for c in CPU_CASES)


@pytest.mark.slow
@pytest.mark.parametrize("case", EAGER, ids=[c.cell_id for c in EAGER])
def test_zoo_verdict(case: Case, tmp_path: Path) -> None:
    assert_case(case, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 977])
@pytest.mark.parametrize("case", STABILITY, ids=[c.cell_id for c in STABILITY])
def test_zoo_verdict_stable_across_seeds(
    case: Case, seed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checks that read the values hold on other seeds; those that do not are run once, above.

    opcheck, the fake/real metadata comparison and the kernel evidence see shapes,
    dtypes, strides and kernel names, never the random values: every case here is
    decided by correctness, gradients or gradcheck.
    """
    monkeypatch.setenv("OPGATE_SKIP_CHECKS", ",".join(SEED_INDEPENDENT))
    assert case.check is None or case.check not in SEED_INDEPENDENT
    assert_case(case, tmp_path, seed)


@pytest.mark.slow
def test_unwritten_tail_is_caught_as_poisoned_nan(tmp_path: Path) -> None:
    """The unwritten rows come back as NaN (poisoned allocation), not as lucky zeros."""
    _, outcome = outcome_of(make_cell("zoo_tail_unwritten", "fp32", "contiguous", "eager"), tmp_path)
    comp = check_of(outcome, "correctness").details["comparisons"][0]
    assert comp["op_nonfinite"] == 3 * 1000  # rows 64..66 of 67
    assert comp["worst_index"] == [64, 0]


@pytest.mark.slow
def test_hidden_copy_lists_the_copy(tmp_path: Path) -> None:
    _, outcome = outcome_of(make_cell("zoo_hidden_copy", "bf16", "transposed", "eager"), tmp_path)
    ev = check_of(outcome, "evidence")
    assert ev.details["extra_copies"] == 1
    assert ev.details["copies"][0].startswith("aten::copy_ c10::BFloat16[67, 1000] <- c10::BFloat16")


@pytest.mark.slow
def test_limits_messages(tmp_path: Path) -> None:
    _, refused = outcome_of(make_cell("zoo_limits", "fp16", "contiguous", "eager", impl="refuses"), tmp_path)
    assert "float16 is not implemented" in refused.reason
    assert [c.name for c in refused.checks] == ["limits"]
    _, works = outcome_of(make_cell("zoo_limits", "fp16", "contiguous", "eager", impl="works"), tmp_path)
    assert "declared unsupported" in works.reason
    assert "drop the declaration" in works.reason
    _, wrong = outcome_of(make_cell("zoo_limits", "fp16", "contiguous", "eager", impl="wrong"), tmp_path)
    assert "silently wrong" in wrong.reason


@pytest.mark.slow
def test_segfault_and_hang_are_errors_through_the_runner(tmp_path: Path) -> None:
    """Native crashes kill the worker: the runner records error (signal / timeout), neighbours keep theirs."""
    out = tmp_path / "run"
    cmd = [
        sys.executable, "-m", "opgate.validators", "run", "--config", str(ZOO / "matrix.yaml"),
        "--ops-path", str(ZOO), "--out", str(out), "--retries", "0", "--no-progress", "--no-cache",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert (out / "results.json").is_file(), proc.stderr[-2000:]
    results = json.loads((out / "results.json").read_text())
    by_op = {c["axes"]["op"]: c for c in results["cells"]}
    assert set(by_op) == {"zoo_segfault", "zoo_hang", "zoo_good"}, proc.stderr[-2000:]
    assert by_op["zoo_segfault"]["verdict"] == "error"
    assert "SIGSEGV" in by_op["zoo_segfault"]["reason"]
    assert by_op["zoo_hang"]["verdict"] == "error"
    assert "timeout" in by_op["zoo_hang"]["reason"]
    assert by_op["zoo_good"]["verdict"] == "pass"
    assert proc.returncode != 0  # a red gate


@pytest.mark.slow
def test_mutations_are_named_and_do_not_spill_into_other_checks(tmp_path: Path) -> None:
    """The mutation check names the write; the gradient checks judge the arithmetic only."""
    _, fwd = outcome_of(make_cell("zoo_mutates_input", "bf16", "contiguous", "eager"), tmp_path)
    assert fwd.reason.startswith("mutation: forward writes into input 0 (declared functional): ")
    _, bwd = outcome_of(make_cell("zoo_mutates_grad", "fp32", "contiguous", "eager"), tmp_path)
    assert bwd.reason.startswith("mutation: backward writes into grad_output 0 (declared functional): ")
    assert check_of(bwd, "gradients").status.value == "pass"
    assert check_of(bwd, "gradcheck").status.value == "pass"  # no "Backward is not reentrant"


@pytest.mark.slow
def test_a_float_style_reference_leaves_gradcheck_running_in_float64(tmp_path: Path) -> None:
    _, outcome = outcome_of(make_cell("zoo_float_ref", "fp32", "contiguous", "eager"), tmp_path)
    check = check_of(outcome, "gradcheck")
    assert check.status.value == "pass", check.summary
    assert check.details["fp64_rel_err"] < 1e-12


def test_gpu_run_is_checked_against_the_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``gpu_cases --check`` names each GPU cell whose verdict or deciding check differs from CASES."""
    from tests.zoo.gpu_cases import check

    results = tmp_path / "results.json"
    cells = [
        {"id": "a", "verdict": "fallback", "checks": [{"name": "evidence", "status": "fallback"}]},
        {"id": "b", "verdict": "fail", "checks": [{"name": "correctness", "status": "fail"}], "reason": "x"},
    ]
    results.write_text(json.dumps({"cells": cells}))
    expected = [("a", "fallback", "evidence"), ("b", "fail", "fake_meta"), ("c", "pass", None)]
    assert check(results, expected) == 1
    out = capsys.readouterr().out
    assert "DIFFERS b" in out
    assert "MISSING c" in out
    assert "1/3 cases as expected" in out
    assert check(results, expected[:1]) == 0


def test_the_committed_h200_zoo_run_has_only_torchs_own_errors_and_the_aoti_cells_it_left_out(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The H200's zoo run (torch 2.11): every case as expected but torch's own triton_op bug."""
    from tests.zoo.gpu_cases import main

    committed = REPO / "results" / "runs" / "h200-sm_90-zoo" / "results.json"
    assert main(["sm_90", "13.0", "--check", str(committed)]) == 1  # the 3 aoti cases did not run
    out = capsys.readouterr().out
    assert "DIFFERS" not in out
    assert out.count("MISSING") == 3
    assert all(line.endswith("-aoti") for line in out.splitlines() if line.startswith("MISSING"))
    known = [line for line in out.splitlines() if line.startswith("KNOWN")]
    assert len(known) == 2
    assert all(
        "zoo_triton_op" in line and "-compile:" in line and "h200-triton-op-repro" in line for line in known
    )
    assert "123/126 cases as expected (2 of them decided by torch itself: KNOWN)" in out


def test_the_committed_h200_aoti_cases_are_this_images_own_failures(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The 3 aoti cases on the H200: its AOTInductor loader's SIGSEGV (the controls too), torch's bug."""
    from tests.zoo.gpu_cases import main

    committed = REPO / "results" / "runs" / "h200-zoo-aoti" / "results.json"
    assert main(["sm_90", "13.0", "--check", str(committed)]) == 1  # only the aoti cells ran
    out = capsys.readouterr().out
    assert "DIFFERS" not in out
    known = [line for line in out.splitlines() if line.startswith("KNOWN")]
    assert len(known) == 3
    assert all("-aoti:" in line for line in known)
    assert sum("environment" in line and "h200-aoti)" in line for line in known) == 2
    assert sum("zoo_triton_op" in line and "h200-triton-op-repro" in line for line in known) == 1
    assert out.count("MISSING") == 123


def test_an_aoti_environment_verdict_counts_only_in_the_torch_it_was_seen_in(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.zoo.gpu_cases import check

    def cell(torch_version: str) -> dict[str, Any]:
        return {
            "id": f"t{torch_version}",
            "axes": {"op": "zoo_good", "mode": "aoti", "torch": torch_version},
            "verdict": "environment",
            "reason": "environment: aoti is broken here, the op's own reference fails the same way",
            "checks": [{"name": "aoti", "status": "error"}],
        }

    results = tmp_path / "results.json"
    results.write_text(json.dumps({"cells": [cell("2.11.0"), cell("2.13.0")]}))
    assert check(results, [("t2.11.0", "pass", None), ("t2.13.0", "pass", None)]) == 1
    out = capsys.readouterr().out
    assert "KNOWN t2.11.0" in out
    assert "DIFFERS t2.13.0" in out


@pytest.mark.parametrize(
    ("torch_version", "reason"),
    [
        (
            "2.13.0+cu130",
            "correctness: TypeError: launcher() missing 1 required positional argument: '_grid_2'",
        ),
        ("2.11.0+cu130", "correctness: RuntimeError: CUDA error: an illegal memory access was encountered"),
    ],
)
def test_a_torch_bug_counts_only_in_its_torch_and_with_its_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], torch_version: str, reason: str
) -> None:
    from tests.zoo.gpu_cases import check

    cell = {
        "id": "t",
        "axes": {"op": "zoo_triton_op", "mode": "compile", "torch": torch_version.partition("+")[0]},
        "verdict": "error",
        "reason": reason,
        "checks": [{"name": "correctness", "status": "error"}],
    }
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"env": {"torch": torch_version}, "cells": [cell]}))
    assert check(results, [("t", "pass", None)]) == 1
    out = capsys.readouterr().out
    assert "DIFFERS t" in out
    assert "KNOWN" not in out
