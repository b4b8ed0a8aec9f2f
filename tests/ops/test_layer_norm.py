"""Direct tests of opgate::layer_norm with and without the fused GELU (CPU interpreter)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from opgate.ops.layer_norm import reference as ref
from opgate.ops.layer_norm.triton_impl import layer_norm
from tests.ops._helpers import DEVICE, DTYPES, LAYOUTS, compare_op, with_layout


def _sample(
    shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0
) -> tuple[tuple[torch.Tensor, ...], dict[str, Any]]:
    s = ref.sample_inputs(shape, dtype, DEVICE, torch.Generator().manual_seed(seed))
    return s.args, s.kwargs


@pytest.mark.parametrize("gelu", [0, 1], ids=["plain", "gelu"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_forward_backward_per_dtype_and_layout(dtype: str, layout: str, gelu: int) -> None:
    (x, w, b), kw = _sample((37, 600, gelu), DTYPES[dtype])
    compare_op(layer_norm, ref.layer_norm, (with_layout(x, layout), w, b), kw, (0, 1, 2), backward=True)


@pytest.mark.parametrize(
    "shape",
    [(5, 33, 1), (3, 20000, 1), (3, 20000, 0), (2, 3, 4, 24, 1)],
    ids=["tiny", "wide-gelu", "wide", "4d"],
)
def test_other_shapes(shape: tuple[int, ...]) -> None:
    (x, w, b), kw = _sample(shape, torch.bfloat16, seed=1)
    compare_op(layer_norm, ref.layer_norm, (x, w, b), kw, (0, 1, 2), backward=True)


def test_large_mean_keeps_precision() -> None:
    # a one-pass E[x^2] - E[x]^2 variance would lose most digits here in float32
    (x, w, b), kw = _sample((16, 512, 0), torch.float32, seed=2)
    compare_op(layer_norm, ref.layer_norm, (x + 1000.0, w, b), kw, (0, 1, 2), backward=True)


@pytest.mark.parametrize("gelu", [False, True])
def test_float64_gradcheck(gelu: bool) -> None:
    (x, w, b), _ = _sample((3, 10, 0), torch.float64, seed=3)
    assert torch.autograd.gradcheck(
        lambda a, c, d: layer_norm(a, c, d, 1e-5, gelu),
        (x.requires_grad_(), w.requires_grad_(), b.requires_grad_()),
        fast_mode=True,
    )


def test_zero_rows_and_opcheck() -> None:
    x = torch.empty((0, 16), requires_grad=True, device=DEVICE)
    w, b = (
        torch.ones(16, requires_grad=True, device=DEVICE),
        torch.zeros(16, requires_grad=True, device=DEVICE),
    )
    layer_norm(x, w, b, 1e-5, True).sum().backward()
    assert w.grad is not None
    assert b.grad is not None
    assert torch.equal(w.grad, torch.zeros(16, device=DEVICE))
    assert torch.equal(b.grad, torch.zeros(16, device=DEVICE))
    (x2, w2, b2), _ = _sample((4, 24, 1), torch.float32, seed=4)
    torch.library.opcheck(torch.ops.opgate.layer_norm.default, (x2, w2, b2, 1e-5, True))


def test_bias_shape_mismatch_is_a_clear_error() -> None:
    with pytest.raises(RuntimeError, match="b must be"):
        layer_norm(
            torch.ones(2, 8, device=DEVICE), torch.ones(8, device=DEVICE), torch.ones(7, device=DEVICE)
        )


def test_backward_without_prefetch(monkeypatch: pytest.MonkeyPatch) -> None:
    from opgate.ops import _triton_util

    monkeypatch.setitem(_triton_util.BWD_TUNING, "prefetch", False)
    (x, w, b), kw = _sample((37, 200, 1), torch.float32, seed=8)
    compare_op(layer_norm, ref.layer_norm, (x, w, b), kw, (0, 1, 2), backward=True)
