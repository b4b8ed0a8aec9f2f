"""Verdicts independent of the random inputs: 50 seeds, bf16 and fp16, through the real checks.

The correctness and gradients checks (oracle, tolerance rule, summaries) run
on a zoo cell's context with the op swapped for plain PyTorch ops written the
way other people write them:

* correct, rounding once (``F.rms_norm`` in float32, another accumulation
  order than the reference);
* correct, rounding twice, exactly as Hugging Face's LlamaRMSNorm does
  (``weight * hidden_states.to(input_dtype)``; Liger's RMSNorm rounds the same
  way) and as Liger's SwiGLU-style ``silu(x).to(dtype) * y`` would;
* planted faults: sum of squares accumulated in truncating bf16 chunks (lost
  accumulation precision), strides ignored, a tail of rows never written, the
  classic wrong backward.

Every correct op must pass on every seed and every fault fail on every seed:
a single flip fails the test, and the worst margin of each class is reported.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from opgate.validators.checks import correctness, gradients
from opgate.validators.checks.artifacts import Artifact
from opgate.validators.checks.cell import poisoned_allocations
from opgate.validators.checks.context import CellContext, build_context
from opgate.validators.result import Verdict
from tests.zoo.harness import make_cell, specs

SEEDS = range(50)
DTYPES = ("bf16", "fp16")


def _acc(x: torch.Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, torch.float32)


def single_rounding(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return F.rms_norm(x.to(_acc(x)), (x.shape[-1],), w.to(_acc(x)), eps).to(x.dtype)


def hf_llama_rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """transformers' LlamaRMSNorm.forward, verbatim but for names."""
    input_dtype = x.dtype
    hidden_states = x.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + eps)
    return w * hidden_states.to(input_dtype)


def bf16_accumulation(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Sum of squares kept in bf16 between 64-column chunks, truncated (the zoo's bf16_accum fault)."""
    if x.dtype != torch.bfloat16:
        return single_rounding(x, w, eps)
    xf = x.float()
    acc = torch.zeros(x.shape[0], dtype=torch.float32)
    for start in range(0, x.shape[1], 64):
        total = acc + xf[:, start : start + 64].pow(2).sum(-1)
        acc = (total.view(torch.int32) & -65536).view(torch.float32)
    rstd = torch.rsqrt(acc / x.shape[1] + eps)[:, None]
    return (xf * rstd * w.float()).to(x.dtype)


def ignores_strides(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Reads x's storage as if it were contiguous (the zoo's ignores_strides fault)."""
    flat = torch.as_strided(x, x.shape, (x.shape[1], 1), x.storage_offset())
    return single_rounding(flat, w, eps)


def tail_unwritten(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """The last M % 4 rows are never written (the zoo's floor-division grid)."""
    y = torch.empty_like(x)
    keep = x.shape[0] - x.shape[0] % 4
    y[:keep] = single_rounding(x[:keep], w, eps)
    return y


class _DroppedProjection(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        ctx.eps = eps
        return single_rounding(x, w, eps)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        x, w = ctx.saved_tensors
        xf, wf, gf = x.to(_acc(x)), w.to(_acc(x)), g.to(_acc(x))
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + ctx.eps)
        return (gf * wf * rstd).to(x.dtype), (gf * xf * rstd).sum(0).to(w.dtype), None


def wrong_backward(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    out: torch.Tensor = _DroppedProjection.apply(x, w, eps)
    return out


Check = Callable[[CellContext], Any]
CORRECT = [("single rounding", single_rounding), ("HF LlamaRMSNorm double rounding", hf_llama_rms_norm)]


@dataclasses.dataclass(frozen=True)
class Fault:
    name: str
    op: Callable[..., Any]
    zoo: str  # the zoo spec whose shapes, reference and inputs it runs on
    layout: str
    check: Check  # the check that must fail
    dtypes: tuple[str, ...] = DTYPES  # where the fault shows


FAULTS = [
    Fault("bf16 accumulation", bf16_accumulation, "zoo_bf16_accum", "contiguous", correctness.run, ("bf16",)),
    Fault("ignores strides", ignores_strides, "zoo_good", "transposed", correctness.run),
    Fault("unwritten tail", tail_unwritten, "zoo_good", "contiguous", correctness.run),
    Fault("wrong backward", wrong_backward, "zoo_good", "contiguous", gradients.run),
]


def _context(
    op: Callable[..., Any], dtype: str, layout: str, seed: int, *, tmp_path: Path, zoo: str
) -> CellContext:
    """A zoo cell's context (its shapes, reference, sample inputs) with ``op`` as the op under test."""
    ctx = build_context(make_cell(zoo, dtype, layout, "eager"), specs()[zoo], "cpu", seed, tmp_path)
    return dataclasses.replace(ctx, op=op, artifact=Artifact(op))


def _margins(result: Any) -> float:
    """The worst op_ulps / allowed_ulps over the result's comparisons (NaN outputs count as infinite)."""
    worst = 0.0
    for c in result.details["comparisons"]:
        if c["op_nonfinite"]:
            return float("inf")
        worst = max(worst, c["op_ulps"] / c["allowed_ulps"])
    return worst


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("name", "op"), CORRECT, ids=[n for n, _ in CORRECT])
def test_correct_ops_pass_on_every_seed(
    name: str, op: Callable[..., Any], dtype: str, tmp_path: Path
) -> None:
    """Seeds alternate the layout and the shape set: the 67 x 1000 / 8 x 2048 and the 16 x 4096 rows."""
    flips, worst = [], 0.0
    with poisoned_allocations():
        for seed in SEEDS:
            layout = "contiguous" if seed % 2 else "transposed"
            zoo = "zoo_good" if seed % 4 < 2 else "zoo_bf16_accum"
            ctx = _context(op, dtype, layout, seed, tmp_path=tmp_path, zoo=zoo)
            for check in (correctness.run, gradients.run):
                result = check(ctx)
                worst = max(worst, _margins(result))
                if result.status is not Verdict.PASS:
                    flips.append(f"seed {seed}: {result.summary}")
    assert not flips, f"{name} {dtype}: {len(flips)} of {2 * len(SEEDS)} flipped: {flips[:3]}"
    assert worst < 0.9, f"{name} {dtype}: worst margin {worst:.2f} of the bound"


@pytest.mark.slow
@pytest.mark.parametrize("fault", FAULTS, ids=[f.name for f in FAULTS])
def test_planted_faults_fail_on_every_seed(fault: Fault, tmp_path: Path) -> None:
    name = fault.name
    passed, best = [], float("inf")
    with poisoned_allocations():
        for dtype in fault.dtypes:
            for seed in SEEDS:
                ctx = _context(fault.op, dtype, fault.layout, seed, tmp_path=tmp_path, zoo=fault.zoo)
                result = fault.check(ctx)
                best = min(best, _margins(result))
                if result.status is not Verdict.FAIL:
                    passed.append(f"{dtype} seed {seed}: {result.status.value} {result.summary}")
    assert not passed, f"{name}: escaped on {len(passed)} seeds: {passed[:3]}"
    assert best > 2.0, f"{name}: closest call {best:.2f} x the bound"
