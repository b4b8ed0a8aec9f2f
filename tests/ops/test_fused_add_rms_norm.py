"""Direct tests of opgate::fused_add_rms_norm (Triton kernels under the CPU interpreter)."""

from __future__ import annotations

import pytest
import torch

from opgate.ops.fused_add_rms_norm import reference as ref
from opgate.ops.fused_add_rms_norm.triton_impl import fused_add_rms_norm
from tests.ops._helpers import DEVICE, DTYPES, LAYOUTS, compare_op, with_layout


def _sample(shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, ...]:
    return ref.sample_inputs(shape, dtype, DEVICE, torch.Generator().manual_seed(seed)).args


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_forward_backward_per_dtype_and_layout(dtype: str, layout: str) -> None:
    x, r, w = _sample((67, 1000), DTYPES[dtype])
    # x takes the layout, residual a different one: the kernel must not assume they match
    args = (
        with_layout(x, layout),
        with_layout(r, "transposed" if layout == "contiguous" else "contiguous"),
        w,
    )
    compare_op(fused_add_rms_norm, ref.fused_add_rms_norm, args, {"eps": 1e-6}, (0, 1, 2), backward=True)


@pytest.mark.parametrize("shape", [(5, 33), (3, 20000), (2, 3, 5, 24)], ids=["tiny", "wide-chunked", "4d"])
def test_other_shapes(shape: tuple[int, ...]) -> None:
    args = _sample(shape, torch.bfloat16, seed=1)
    compare_op(fused_add_rms_norm, ref.fused_add_rms_norm, args, {}, (0, 1, 2), backward=True)


def test_gradients_are_separate_buffers_and_new_residual_is_exact() -> None:
    x, r, w = (a.requires_grad_(True) for a in _sample((7, 96), torch.float16, seed=2))
    y, h = fused_add_rms_norm(x, r, w)
    assert torch.equal(h, (x + r).detach())  # the sum is rounded exactly like aten's add
    (y.float().sum() + 2 * h.float().sum()).backward()
    assert x.grad is not None
    assert r.grad is not None
    assert torch.equal(x.grad, r.grad)
    assert x.grad.data_ptr() != r.grad.data_ptr()


def test_only_y_used_gives_correct_grads() -> None:
    x, r, w = _sample((3, 16), torch.float64, seed=3)
    assert torch.autograd.gradcheck(
        lambda a, b, c: fused_add_rms_norm(a, b, c, 1e-6)[0],
        (x.requires_grad_(), r.requires_grad_(), w.requires_grad_()),
        eps=1e-6,
        atol=1e-6,
        fast_mode=True,
    )


def test_zero_rows() -> None:
    x = torch.empty((0, 32), requires_grad=True, device=DEVICE)
    r = torch.empty((0, 32), requires_grad=True, device=DEVICE)
    w = torch.ones(32, requires_grad=True, device=DEVICE)
    y, h = fused_add_rms_norm(x, r, w)
    assert y.shape == h.shape == (0, 32)
    (y.sum() + h.sum()).backward()
    assert w.grad is not None
    assert torch.equal(w.grad, torch.zeros(32, device=DEVICE))


def test_opcheck_and_mismatched_residual_error() -> None:
    x, r, w = _sample((6, 40), torch.float32, seed=5)
    torch.library.opcheck(torch.ops.opgate.fused_add_rms_norm.default, (x, r, w, 1e-6))
    with pytest.raises(RuntimeError, match="residual shape"):
        fused_add_rms_norm(x, r[:, :20], w)
