"""Direct tests of opgate::silu_mul (Triton kernels under the CPU interpreter)."""

from __future__ import annotations

import pytest
import torch

from opgate.ops.silu_mul import reference as ref
from opgate.ops.silu_mul.triton_impl import silu_mul
from tests.ops._helpers import DEVICE, DTYPES, LAYOUTS, compare_op, with_layout


def _sample(shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, ...]:
    return ref.sample_inputs(shape, dtype, DEVICE, torch.Generator().manual_seed(seed)).args


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_forward_backward_per_dtype_and_layout(dtype: str, layout: str) -> None:
    a, b = _sample((67, 1000), DTYPES[dtype])
    compare_op(
        silu_mul, ref.silu_mul, (with_layout(a, layout), with_layout(b, layout)), {}, (0, 1), backward=True
    )


@pytest.mark.parametrize(
    "shape", [(5, 33), (3, 5000), (2, 3, 4, 24), (7,)], ids=["tiny", "multi-colblock", "4d", "1d"]
)
def test_other_shapes(shape: tuple[int, ...]) -> None:
    a, b = _sample(shape, torch.bfloat16, seed=1)
    compare_op(silu_mul, ref.silu_mul, (a, with_layout(b, "transposed")), {}, (0, 1), backward=True)


def test_float64_gradcheck() -> None:
    a, b = _sample((3, 11), torch.float64, seed=2)
    assert torch.autograd.gradcheck(silu_mul, (a.requires_grad_(), b.requires_grad_()), fast_mode=True)


def test_zero_rows_and_opcheck() -> None:
    a = torch.empty((0, 16), requires_grad=True, device=DEVICE)
    b = torch.empty((0, 16), requires_grad=True, device=DEVICE)
    y = silu_mul(a, b)
    y.sum().backward()
    assert y.shape == (0, 16)
    assert a.grad is not None
    assert a.grad.shape == (0, 16)
    a2, b2 = _sample((4, 24), torch.float32, seed=3)
    torch.library.opcheck(torch.ops.opgate.silu_mul.default, (a2, b2))


def test_shape_mismatch_is_a_clear_error() -> None:
    with pytest.raises(RuntimeError, match="a shape"):
        silu_mul(torch.ones(4, 8, device=DEVICE), torch.ones(4, 9, device=DEVICE))
