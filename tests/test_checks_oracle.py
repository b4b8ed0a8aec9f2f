"""The float64 oracle is float64: model-style casts mapped, the rest named before any check runs."""

from __future__ import annotations

import dataclasses
import inspect
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from opgate.matrix.spec import load_spec, load_specs, resolve
from opgate.ops.base import SampleInput
from opgate.validators.checks import correctness, gradcheck, run_cell
from opgate.validators.checks.artifacts import Artifact
from opgate.validators.checks.cell import fresh_compiler_state, poisoned_allocations
from opgate.validators.checks.context import CellContext, build_context
from opgate.validators.checks.oracle import audit, oracle
from opgate.validators.result import Verdict
from tests.zoo.harness import make_cell, specs


def hf_style(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    xf = x.float()
    variance = xf.pow(2).mean(-1, keepdim=True)
    return (xf * torch.rsqrt(variance + eps) * w.float()).to(x.dtype)


def exact(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    x, w = x.double(), w.double()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def sample() -> SampleInput:
    g = torch.Generator().manual_seed(5)
    x = torch.randn((16, 300), generator=g).to(torch.bfloat16)
    return SampleInput(args=(x, torch.randn(300, generator=g).to(torch.bfloat16)), kwargs={"eps": 1e-6})


def test_a_float_style_reference_gets_a_float64_oracle() -> None:
    s = sample()
    got = oracle(hf_style, s)
    assert got.dtype == torch.float64
    assert float((got - exact(*s.args)).abs().max()) < 1e-13
    naive = hf_style(*(a.double() for a in s.args))  # what upcasting the inputs alone gives
    assert float((naive - exact(*s.args)).abs().max()) > 1e-8
    assert torch.get_default_dtype() == torch.float32  # restored


def test_every_spelling_of_a_low_precision_dtype_means_float64() -> None:
    def casts(x: torch.Tensor) -> list[torch.Tensor]:
        return [
            x.half(),
            x.bfloat16(),
            x.to(torch.float32),
            x.to("cpu", torch.float16),
            x.to(dtype=torch.bfloat16),
            x.type(torch.float32),
            torch.zeros(3, dtype=torch.float16),
            torch.ones(3),
            x.sum(dtype=torch.float32),
            F.softmax(x, -1, dtype=torch.float32),
            torch.empty_like(x, dtype=torch.bfloat16),
        ]

    outs = oracle(casts, SampleInput(args=(torch.randn(4, 5),)))
    assert {t.dtype for t in outs} == {torch.float64}
    assert audit(casts, SampleInput(args=(torch.randn(4, 5),))) is None


def test_what_cannot_be_mapped_is_named_with_its_line() -> None:
    import numpy as np

    def via_numpy(x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(np.sin(x.numpy().astype(np.float32))) * 2

    problem = audit(via_numpy, SampleInput(args=(torch.randn(4, 5),)))
    assert problem is not None
    line = inspect.getsourcelines(via_numpy)[1] + 1
    assert f"{Path(__file__).name}:{line}" in problem
    assert "computes in float32" in problem
    assert "promote_types" in problem  # the fix


def test_every_shipped_reference_is_float64_clean() -> None:
    for spec in [*load_specs().values(), *specs().values()]:
        ref = resolve(spec.reference, spec.root)
        make = resolve(spec.samples, spec.root)
        s = make(tuple(spec.shapes["default"][0]), torch.bfloat16, "cpu", torch.Generator().manual_seed(0))
        assert audit(ref, s) is None, spec.op


REF_MODULE = """
import numpy as np
import torch

from opgate.ops.base import SampleInput, randn


def reference(x):
    return torch.from_numpy(np.tanh(x.detach().numpy().astype(np.float32))).to(x.dtype)


def op(x):
    return torch.tanh(x)


def samples(shape, dtype, device, generator):
    return SampleInput(args=(randn(tuple(shape), dtype, device, generator),), grad_args=())
"""

SPEC = """
spec_version: 1
op: np_tanh
summary: "reference through numpy float32"
category: other
reference: opgate_np_ref:reference
samples: opgate_np_ref:samples
shapes: {default: [[4, 8]]}
dtypes: [fp32]
layouts: [contiguous]
modes: [eager]
tolerance: {k: 2.0, atol_floor: 1.0e-5}
implementations:
  aten:
    kind: external
    entry: opgate_np_ref:op
    evidence: {cpu: {expect: ["aten::tanh"]}, cuda: {expect: ["*tanh*"]}}
"""


def test_a_cell_whose_oracle_is_not_float64_is_an_error_before_any_check(tmp_path: Path) -> None:
    (tmp_path / "opgate_np_ref.py").write_text(textwrap.dedent(REF_MODULE))
    (tmp_path / "np_tanh").mkdir()
    (tmp_path / "np_tanh" / "spec.yaml").write_text(SPEC)
    spec = load_spec(tmp_path / "np_tanh" / "spec.yaml", tmp_path)
    cell = dataclasses.replace(make_cell("np_tanh", "fp32", "contiguous", "eager"), impl="aten")
    out = run_cell(cell, spec, "cpu", 1, tmp_path / "work")
    assert [c.name for c in out.checks] == ["oracle"]
    assert out.checks[0].status is Verdict.ERROR
    assert out.reason.startswith("oracle: the float64 oracle is not float64")
    assert "opgate_np_ref.py:9" in out.reason


def _float_ref_context(tmp_path: Path, dtype: str = "fp32") -> CellContext:
    cell = make_cell("zoo_float_ref", dtype, "contiguous", "eager")
    ctx = build_context(cell, specs()["zoo_float_ref"], "cpu", 3, tmp_path)
    return dataclasses.replace(ctx, artifact=Artifact(ctx.op))


def test_gradcheck_with_a_float_style_reference(tmp_path: Path) -> None:
    """The correct float64 kernel passes; an op computing in float32 is a skip, never a false fail."""
    ctx = _float_ref_context(tmp_path)
    float_op = resolve("zoo_ops.reference:rms_norm_float", specs()["zoo_float_ref"].root)
    with fresh_compiler_state(cpu=True), poisoned_allocations():
        real = gradcheck.run(ctx)
        lossy = gradcheck.run(dataclasses.replace(ctx, op=float_op))
    assert real.status is Verdict.PASS, real.summary
    assert real.details["fp64_rel_err"] < 1e-12
    assert lossy.status is Verdict.SKIP, lossy.summary  # fp64_rel_err was 0.0 against a float32 "oracle"
    assert lossy.details["fp64_rel_err"] > 1e-9


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_the_float_style_reference_has_its_own_error_measured(tmp_path: Path, dtype: str) -> None:
    ctx = _float_ref_context(tmp_path, dtype)
    with fresh_compiler_state(cpu=True), poisoned_allocations():
        result = correctness.run(ctx)
    assert result.status is Verdict.PASS, result.summary
    assert all(c["ref_ulps"] > 0 for c in result.details["comparisons"])  # not 0: a float32 oracle
