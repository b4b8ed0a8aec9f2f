"""run_cell plumbing: modes, skips with reasons, setup errors, state restored, and the real rms_norm."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from opgate.matrix.cell import Cell
from opgate.validators.checks import CellOutcome, gradcheck, run_cell
from opgate.validators.checks.base import Check, run_check
from opgate.validators.checks.cell import fresh_compiler_state, poisoned_allocations
from opgate.validators.checks.context import build_context
from opgate.validators.result import CheckResult, Verdict
from tests.zoo.harness import make_cell, run, specs


def test_poisoned_allocations_fill_with_nan_and_restore_state() -> None:
    was = torch.are_deterministic_algorithms_enabled()
    with poisoned_allocations():
        assert torch.isnan(torch.empty(1000)).all()
        assert torch.isnan(torch.empty_like(torch.ones(3, 3, dtype=torch.bfloat16))).all()
    assert torch.are_deterministic_algorithms_enabled() == was


def test_run_check_turns_reasons_into_skips_and_exceptions_into_errors() -> None:
    skip = run_check(Check("c", lambda ctx: "not here", lambda ctx: CheckResult("c", Verdict.PASS)), None)  # type: ignore[arg-type]
    assert (skip.status, skip.summary) == (Verdict.SKIP, "not here")

    def boom(ctx: Any) -> CheckResult:
        raise ValueError("bad stride\nmore lines")

    err = run_check(Check("c", lambda ctx: None, boom), None)  # type: ignore[arg-type]
    assert err.status is Verdict.ERROR
    assert err.summary == "ValueError: bad stride; more lines"
    assert err.details["exception"] == "ValueError"


@pytest.mark.integration
def test_export_keeps_the_op_node(tmp_path: Path) -> None:
    verdict, outcome = run(make_cell("zoo_good", "fp32", "transposed", "export"), tmp_path)
    assert verdict is Verdict.PASS, outcome.reason
    export = next(c for c in outcome.checks if c.name == "export")
    assert all("zoo::good_rms_norm" in g["ops"] for g in export.details["graphs"])
    assert all("zoo::good_rms_norm" in g["decomposed_ops"] for g in export.details["graphs"])
    assert [c.name for c in outcome.checks] == ["fake_meta", "export", "correctness", "mutation", "evidence"]


@pytest.mark.slow
def test_aoti_package_load_run(tmp_path: Path) -> None:
    verdict, outcome = run(make_cell("zoo_good", "fp32", "contiguous", "aoti", shapes="small"), tmp_path)
    assert verdict is Verdict.PASS, [(c.name, c.status, c.summary) for c in outcome.checks]
    aoti = next(c for c in outcome.checks if c.name == "aoti")
    assert len(aoti.details["packages"]) == 1
    assert Path(aoti.details["packages"][0]).is_file()


def test_cudagraphs_need_a_gpu(tmp_path: Path) -> None:
    verdict, outcome = run(make_cell("zoo_good", "fp32", "contiguous", "cudagraphs"), tmp_path)
    assert verdict is Verdict.SKIP
    assert "CUDA" in outcome.reason


def test_impossible_layout_is_a_skip_with_the_reason(tmp_path: Path) -> None:
    verdict, outcome = run(make_cell("zoo_good", "fp32", "transposed", "eager", shapes="row"), tmp_path)
    assert verdict is Verdict.SKIP
    assert "transposed needs the last two dims >= 2" in outcome.reason


def _spec_with(impl_changes: dict[str, Any]) -> Any:
    spec = specs()["zoo_good"]
    impl = dataclasses.replace(spec.implementations["triton"], **impl_changes)
    return dataclasses.replace(spec, implementations={"triton": impl})


def test_missing_required_distribution_is_a_skip(tmp_path: Path) -> None:
    spec = _spec_with({"requires": ["opgate-absent-distribution"]})
    out = run_cell(make_cell("zoo_good", "fp32", "contiguous", "eager"), spec, "cpu", 1, tmp_path)
    assert out.verdict is Verdict.SKIP
    assert "opgate-absent-distribution" in out.reason


def test_an_op_that_does_not_import_is_an_error_not_a_crash(tmp_path: Path) -> None:
    spec = _spec_with({"module": "zoo_ops.no_such_module"})
    out = run_cell(make_cell("zoo_good", "fp32", "contiguous", "eager"), spec, "cpu", 1, tmp_path)
    assert out.verdict is Verdict.ERROR
    assert out.checks[0].name == "setup"
    assert "zoo_ops.no_such_module" in out.reason


def test_build_cells_go_to_the_build_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from opgate.validators.checks import build

    seen: list[Cell] = []

    def fake_build(cell: Cell, spec: Any, device: str, seed: int, workdir: Path) -> CellOutcome:
        seen.append(cell)
        return CellOutcome([CheckResult("build", Verdict.PASS, "sm_90 cubin")])

    monkeypatch.setattr(build, "run_cell", fake_build)
    cell = make_cell("zoo_good", "all", "all", "build")
    out = run_cell(cell, specs()["zoo_good"], "cpu", 1, tmp_path)
    assert seen == [cell]
    assert out.checks[0].summary == "sm_90 cubin"


def test_build_cells_without_a_build_check_are_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "opgate.validators.checks.build", None)
    out = run_cell(make_cell("zoo_good", "all", "all", "build"), specs()["zoo_good"], "cpu", 1, tmp_path)
    assert out.verdict is Verdict.SKIP


def _gradcheck_with(op: Any, tmp_path: Path) -> CheckResult:
    ctx = build_context(
        make_cell("zoo_good", "fp32", "contiguous", "eager"), specs()["zoo_good"], "cpu", 3, tmp_path
    )
    ctx = dataclasses.replace(ctx, op=op)
    with fresh_compiler_state(cpu=True), poisoned_allocations():
        return gradcheck.run(ctx)


def test_gradcheck_skips_ops_without_real_float64(tmp_path: Path) -> None:
    def refuses(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
        raise TypeError("float64 is not supported by this kernel")

    def fp32_inside(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
        y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps) * w.float()
        return y.to(x.dtype)

    refused = _gradcheck_with(refuses, tmp_path)
    assert refused.status is Verdict.SKIP
    assert "float64 is not supported" in refused.summary
    lossy = _gradcheck_with(fp32_inside, tmp_path)
    assert lossy.status is Verdict.SKIP
    assert "not float64-accurate" in lossy.summary


def test_a_wrong_backward_fails_gradcheck_without_torchs_slow_mode_rerun(tmp_path: Path) -> None:
    """The same GradcheckError, minus torch's slow-mode Jacobians (seconds per failing cell)."""

    class Doubled(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            ctx.save_for_backward(x, w)
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            x, w = ctx.saved_tensors
            with torch.enable_grad():
                xd, wd = x.detach().requires_grad_(), w.detach().requires_grad_()
                y = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6) * wd
                gx, gw = torch.autograd.grad(y, (xd, wd), g)
            return 2 * gx, gw  # planted: twice the input's gradient

    def wrong(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
        return Doubled.apply(x, w)  # type: ignore[no-any-return, no-untyped-call]

    module: Any = sys.modules["torch.autograd.gradcheck"]
    original = module._run_slow_mode_and_get_error
    failed = _gradcheck_with(wrong, tmp_path)
    assert failed.status is Verdict.FAIL
    assert "Jacobian mismatch" in failed.summary
    assert "full Jacobians not recomputed" in failed.summary
    assert module._run_slow_mode_and_get_error is original  # restored
    x, w = torch.randn(3, 4, dtype=torch.float64, requires_grad=True), torch.randn(4, dtype=torch.float64)
    leaves = (x, w.requires_grad_())
    with pytest.raises(module.GradcheckError, match="slow mode"):  # torch's own, outside the check
        torch.autograd.gradcheck(wrong, leaves, fast_mode=True)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("dtype", "layout", "mode"),
    [("bf16", "transposed", "eager"), ("fp16", "strided", "compile"), ("fp32", "offset", "export")],
)
def test_real_rms_norm_passes(dtype: str, layout: str, mode: str, tmp_path: Path) -> None:
    """No false alarms on the project's own Triton rms_norm."""
    from opgate.matrix.spec import load_specs

    spec = load_specs()["rms_norm"]
    cell = make_cell("rms_norm", dtype, layout, mode)
    out = run_cell(cell, spec, "cpu", 11, tmp_path / cell.id)
    bad = [
        (c.name, c.status.value, c.summary)
        for c in out.checks
        if c.status not in (Verdict.PASS, Verdict.SKIP)
    ]
    assert out.verdict is None
    assert not bad


def test_zero_size_keeps_contraction_operands_the_reference_needs(tmp_path: Path) -> None:
    """a @ b with an empty batch: only a's rows go, b's inner dim must stay."""
    from opgate.matrix.spec import load_specs

    spec = load_specs()["matmul"]
    impl = next(iter(spec.implementations))
    cell = make_cell("matmul", "fp32", "zero_size", "eager", impl=impl)
    ctx = build_context(cell, spec, "cpu", 1, tmp_path)
    a, b = ctx.inputs()[0].args
    assert a.shape[0] == 0
    assert b.numel() > 0


def test_compile_signature_separates_what_dynamo_guards_on() -> None:
    from opgate.ops.base import SampleInput
    from opgate.validators.checks.compile import signature

    def s(shape: tuple[int, ...], flag: int = 0) -> SampleInput:
        return SampleInput(args=(torch.ones(shape), flag), kwargs={"eps": 1e-6})

    assert signature(s((67, 1000))) == signature(s((8, 4096)))  # symbolic sizes: one graph
    assert signature(s((67, 1000))) != signature(s((1, 4096)))  # size 1 is specialized
    assert signature(s((67, 1000))) != signature(s((67, 1000), flag=1))  # constants are guarded


def test_compile_signature_knows_duck_sizing() -> None:
    """M == storage offset in one shape but not the next is a legitimate guard failure, not a bug."""
    from opgate.ops.base import SampleInput
    from opgate.validators.checks.compile import signature
    from opgate.validators.layouts import apply_layout

    def s(shape: tuple[int, int]) -> SampleInput:
        return apply_layout(SampleInput(args=(torch.ones(shape),), layout_args=(0,)), "offset")

    assert signature(s((40, 4096))) != signature(s((8, 2048)))  # offset 40 == M only in the first
    assert signature(s((67, 1000))) == signature(s((8, 2048)))
