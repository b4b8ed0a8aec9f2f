"""A forward-only op: its gradient errors say how to declare it, and declared it passes."""

from __future__ import annotations

from pathlib import Path

import torch

from opgate.matrix.cell import Cell
from opgate.matrix.spec import load_specs
from opgate.ops.base import SampleInput
from opgate.validators.checks import run_cell
from opgate.validators.result import Verdict, combine

OPS = Path(__file__).parent / "data" / "forward_only"


def _run(op: str, tmp_path: Path) -> tuple[Verdict, dict[str, tuple[Verdict, str]]]:
    spec = load_specs([OPS])[op]
    cell = Cell(op, "custom", torch.__version__, "none", "cpu", "fp32", "contiguous", "eager")
    outcome = run_cell(cell, spec, "cpu", 7, tmp_path)
    checks = {c.name: (c.status, c.summary) for c in outcome.checks}
    return outcome.verdict or combine(outcome.checks), checks


def test_default_grad_args_are_every_floating_tensor() -> None:
    x, i = torch.ones(2), torch.ones(2, dtype=torch.int64)
    assert SampleInput(args=(x, i, 1.5, x)).differentiable() == (0, 3)
    assert SampleInput(args=(x,), grad_args=()).differentiable() == ()
    assert SampleInput(args=(x, x), grad_args=(1,)).differentiable() == (1,)


def test_undeclared_forward_only_op_is_told_to_declare_grad_args(tmp_path: Path) -> None:
    verdict, checks = _run("fwd_undeclared", tmp_path)
    assert verdict.is_bad
    names = ("gradients", "gradcheck", "opcheck:test_aot_dispatch_dynamic")
    gradient_checks = [n for n in names if n in checks]
    assert "gradients" in gradient_checks
    for name in gradient_checks:
        status, summary = checks[name]
        assert status.is_bad or status is Verdict.ERROR, (name, status)
        assert "SampleInput(grad_args=())" in summary, (name, summary)
        assert "register_autograd" in summary
    assert checks["correctness"][0] is Verdict.PASS  # the numbers are right: only the contract is missing


def test_declared_forward_only_op_passes(tmp_path: Path) -> None:
    verdict, checks = _run("fwd_declared", tmp_path)
    assert verdict is Verdict.PASS, checks
    assert checks["gradients"][0] is Verdict.SKIP
    assert checks["gradcheck"][0] is Verdict.SKIP
