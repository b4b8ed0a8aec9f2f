"""The mutation check: writes into inputs or incoming gradients are named; declared writes are not flagged."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from opgate.matrix.spec import Mutates
from opgate.validators.checks import mutation
from opgate.validators.checks.artifacts import Artifact
from opgate.validators.checks.cell import poisoned_allocations
from opgate.validators.checks.context import CellContext, build_context
from opgate.validators.result import CheckResult, Verdict
from tests.zoo.harness import make_cell, specs


def rms(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def writes_x(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    y = rms(x, w, eps)
    x.data.mul_(0.5)  # what a kernel writing into x's memory does: autograd never sees it
    return y


def writes_around_the_view(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Writes into the storage gap next to a strided view's first element (not one of its elements)."""
    torch.as_strided(x.data, (1,), (1,), x.storage_offset() + 1).fill_(7.0)
    return rms(x, w, eps)


class _GradInPlace(torch.autograd.Function):
    """Backward stores dx into the incoming gradient and returns it (Liger's RMSNorm ``in_place``)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        ctx.eps = eps
        return rms(x, w, eps)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        x, w = ctx.saved_tensors
        with torch.enable_grad():
            xx, ww = x.detach().requires_grad_(True), w.detach().requires_grad_(True)
            dx, dw = torch.autograd.grad(rms(xx, ww, ctx.eps), (xx, ww), g)
        g.copy_(dx)
        return g, dw, None


def writes_grad(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    out: torch.Tensor = _GradInPlace.apply(x, w, eps)
    return out


@torch.library.custom_op("opgate_test::normalize_in_place", mutates_args=("x",))
def _normalize_in_place(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    y = rms(x, w, eps)
    x.copy_(y)
    return y.clone()


def declared_in_place(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    out: torch.Tensor = torch.ops.opgate_test.normalize_in_place(x.detach(), w.detach(), eps)
    return out


def check(op: Callable[..., Any], tmp_path: Path, layout: str = "contiguous", **impl: Any) -> CheckResult:
    cell = make_cell("zoo_good", "fp32", layout, "eager")
    ctx: CellContext = build_context(cell, specs()["zoo_good"], "cpu", 7, tmp_path)
    ctx = dataclasses.replace(ctx, op=op, artifact=Artifact(op))
    if impl:
        ctx = dataclasses.replace(ctx, impl=dataclasses.replace(ctx.impl, **impl))
    with poisoned_allocations():
        return mutation.run(ctx)


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided"])
def test_a_functional_op_passes_forward_and_backward(layout: str, tmp_path: Path) -> None:
    result = check(rms, tmp_path, layout)
    assert result.status is Verdict.PASS, result.summary
    assert result.details["backward_checked"]
    assert result.summary == "no undeclared writes into inputs and grad_outputs"


def test_forward_writes_into_an_input_are_named(tmp_path: Path) -> None:
    result = check(writes_x, tmp_path)
    assert result.status is Verdict.FAIL
    assert result.summary.startswith("forward writes into input 0 (declared functional): ")
    assert "67000 of 67000 elements changed" in result.summary


def test_writes_next_to_a_strided_view_count_too(tmp_path: Path) -> None:
    result = check(writes_around_the_view, tmp_path, "strided")
    assert result.status is Verdict.FAIL
    assert result.summary.startswith("forward writes into input 0 (declared functional): memory around")


def test_backward_writes_into_the_incoming_gradient_are_named(tmp_path: Path) -> None:
    result = check(writes_grad, tmp_path)
    assert result.status is Verdict.FAIL
    assert result.summary.startswith("backward writes into grad_output 0 (declared functional): ")


def test_writes_the_spec_declares_are_not_flagged(tmp_path: Path) -> None:
    assert check(writes_grad, tmp_path, mutates=Mutates(grad_outputs=(0,))).status is Verdict.PASS
    assert check(writes_x, tmp_path, mutates=Mutates(inputs=(0,))).status is Verdict.PASS
    other = check(writes_x, tmp_path, mutates=Mutates(inputs=(1,)))
    assert other.status is Verdict.FAIL
    assert "input 0 (declared to write inputs 1 only)" in other.summary


def test_writes_the_torch_library_schema_declares_are_not_flagged(tmp_path: Path) -> None:
    assert mutation.schema_writes("opgate_test::normalize_in_place") == frozenset({0})
    assert mutation.schema_writes("zoo::good_rms_norm") == frozenset()
    result = check(declared_in_place, tmp_path, qualname="opgate_test::normalize_in_place")
    assert result.status is Verdict.PASS, result.summary
    assert result.details["declared_inputs"] == [0]
    undeclared = check(declared_in_place, tmp_path)  # same op, spec names no qualname to read
    assert undeclared.status is Verdict.FAIL


def test_an_op_refusing_inputs_that_require_grad_still_gets_its_forward_checked(tmp_path: Path) -> None:
    def inference_only(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
        if x.requires_grad:
            raise RuntimeError("no autograd for this kernel")
        return writes_x(x, w, eps)

    result = check(inference_only, tmp_path)
    assert result.status is Verdict.FAIL
    assert result.summary.startswith("forward writes into input 0")
    assert "no autograd for this kernel" in result.details["backward_note"]
