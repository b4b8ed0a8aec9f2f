"""Direct tests of opgate::rms_norm (Triton kernels under the CPU interpreter)."""

from __future__ import annotations

import pytest
import torch

from opgate.ops.rms_norm import reference as ref
from opgate.ops.rms_norm.triton_impl import rms_norm
from tests.ops._helpers import DEVICE, DTYPES, LAYOUTS, assert_close_rule, compare_op, with_layout


def _sample(shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    s = ref.sample_inputs(shape, dtype, DEVICE, torch.Generator().manual_seed(seed))
    return s.args[0], s.args[1]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_forward_backward_per_dtype_and_layout(dtype: str, layout: str) -> None:
    x, w = _sample((67, 1000), DTYPES[dtype])
    x = with_layout(x, layout)
    compare_op(rms_norm, ref.rms_norm, (x, w), {"eps": 1e-6}, (0, 1), backward=True)


@pytest.mark.parametrize(
    "shape", [(5, 33), (3, 20000), (2, 3, 4, 24), (1, 16)], ids=["tiny", "wide-chunked", "4d", "one-row"]
)
def test_shapes_not_multiple_of_blocks_and_wide_rows(shape: tuple[int, ...]) -> None:
    x, w = _sample(shape, torch.bfloat16, seed=1)
    compare_op(rms_norm, ref.rms_norm, (x, w), {"eps": 1e-5}, (0, 1), backward=True)


def test_scrambled_4d_strides_collapse_without_copy() -> None:
    # leading dims permuted so they cannot merge: exercises the 3-leading-dim decode
    x, w = _sample((3, 5, 7, 40), torch.float32, seed=2)
    xp = x.permute(2, 0, 1, 3).contiguous().permute(1, 2, 0, 3)
    assert xp.stride() != x.stride()
    compare_op(rms_norm, ref.rms_norm, (xp, w), {}, (0, 1), backward=True)


def test_broadcast_weight_and_stride0_grad() -> None:
    x, w = _sample((9, 130), torch.float32, seed=3)
    wb = w[:1].expand(130)
    compare_op(rms_norm, ref.rms_norm, (x, wb), {}, (0, 1), backward=True)
    xg = x.clone().requires_grad_(True)
    rms_norm(xg, w).sum().backward()  # grad_output arrives as an all-stride-0 expand
    x64 = x.double().requires_grad_(True)
    ref.rms_norm(x64, w.double()).sum().backward()
    assert xg.grad is not None
    assert x64.grad is not None
    assert_close_rule("dx", xg.grad, xg.grad, x64.grad, k=2.0, floor=1e-5)


def test_zero_rows_return_empty_and_zero_dw() -> None:
    x = torch.empty((0, 64), requires_grad=True, device=DEVICE)
    w = torch.ones(64, requires_grad=True, device=DEVICE)
    y = rms_norm(x, w)
    assert y.shape == (0, 64)
    y.sum().backward()
    assert x.grad is not None
    assert x.grad.shape == (0, 64)
    assert w.grad is not None
    assert torch.equal(w.grad, torch.zeros(64, device=DEVICE))


def test_float64_gradcheck() -> None:
    x, w = _sample((3, 17), torch.float64, seed=4)
    assert torch.autograd.gradcheck(
        lambda a, b: rms_norm(a, b, 1e-6),
        (x.requires_grad_(), w.requires_grad_()),
        eps=1e-6,
        atol=1e-6,
        fast_mode=True,
    )


def test_opcheck_and_fake_shapes() -> None:
    x, w = _sample((6, 48), torch.float32, seed=5)
    torch.library.opcheck(torch.ops.opgate.rms_norm.default, (x, w, 1e-6))
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fx = mode.from_tensor(torch.empty(4, 7, 96, dtype=torch.bfloat16, device=DEVICE))
        fw = mode.from_tensor(torch.empty(96, dtype=torch.bfloat16, device=DEVICE))
        out = torch.ops.opgate.rms_norm(fx, fw, 1e-6)
        assert out.shape == (4, 7, 96)
        assert out.dtype == torch.bfloat16


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "dtype", "match"),
    [
        ((4, 8), (7,), torch.float32, "w has 7 elements"),
        ((4, 8), (2, 4), torch.float32, "w must be 1-d"),
        ((4, 8), (8,), torch.int32, "must be float16"),
    ],
)
def test_bad_input_raises_clear_error(
    x_shape: tuple[int, ...], w_shape: tuple[int, ...], dtype: torch.dtype, match: str
) -> None:
    x = torch.ones(x_shape, dtype=dtype, device=DEVICE)
    w = torch.ones(w_shape, dtype=dtype, device=DEVICE)
    with pytest.raises(RuntimeError, match=match):
        rms_norm(x, w)


def test_the_comparison_rule_catches_a_planted_error() -> None:
    x, w = _sample((8, 64), torch.bfloat16, seed=6)
    good = rms_norm(x, w)
    bad = good.clone()
    bad[3, 5] += 0.25
    oracle = ref.rms_norm(x.double(), w.double())
    assert_close_rule("good", good, ref.rms_norm(x, w), oracle, k=2.0, floor=1e-5)
    with pytest.raises(AssertionError, match="error"):
        assert_close_rule("bad", bad, ref.rms_norm(x, w), oracle, k=2.0, floor=1e-5)


@pytest.mark.parametrize("prefetch", [False, True])
def test_backward_with_and_without_prefetch(prefetch: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    from opgate.ops import _triton_util

    monkeypatch.setitem(_triton_util.BWD_TUNING, "prefetch", prefetch)
    x, w = _sample((37, 200), torch.float32, seed=7)
    compare_op(rms_norm, ref.rms_norm, (x, w), {}, (0, 1), backward=True)
