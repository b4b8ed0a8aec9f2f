"""Direct tests of opgate::rope (Triton kernel under the CPU interpreter)."""

from __future__ import annotations

import pytest
import torch

from opgate.ops.rope import reference as ref
from opgate.ops.rope.triton_impl import rope
from tests.ops._helpers import DEVICE, DTYPES, LAYOUTS, compare_op, with_layout


def _sample(shape: list[int], dtype: torch.dtype, seed: int = 0) -> tuple[tuple[torch.Tensor, ...], str]:
    s = ref.sample_inputs(tuple(shape), dtype, DEVICE, torch.Generator().manual_seed(seed))
    return s.args, s.kwargs["layout"]


@pytest.mark.parametrize("qk_layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_forward_backward_per_dtype_and_layout(dtype: str, layout: str, qk_layout: str) -> None:
    (q, k, cos, sin), lay = _sample([2, 13, 4, 32, 0 if qk_layout == "bshd" else 1], DTYPES[dtype])
    args = (with_layout(q, layout), with_layout(k, layout), cos, sin)
    compare_op(rope, ref.rope, args, {"layout": lay}, (0, 1), backward=True)


def test_broadcast_and_batched_tables() -> None:
    (q, k, cos, sin), lay = _sample([2, 9, 3, 16, 1], torch.float32, seed=1)
    compare_op(
        rope,
        ref.rope,
        (q, k, with_layout(cos, "broadcast"), sin.t().contiguous().t()),
        {"layout": lay},
        (0, 1),
        backward=True,
    )
    # per-batch tables (B, S, D), e.g. from position ids, with halves that differ
    # (the backward is the exact transpose, not rope with -sin)
    cos3 = torch.randn(2, 9, 16, dtype=torch.float32, device=DEVICE)
    sin3 = torch.randn(2, 9, 16, dtype=torch.float32, device=DEVICE)
    compare_op(rope, ref.rope, (q, k, cos3, sin3), {"layout": lay}, (0, 1), backward=True)


def test_backward_of_usual_tables_is_rope_with_negated_sin() -> None:
    (q, k, cos, sin), lay = _sample([1, 7, 2, 8, 0], torch.float64, seed=2)
    gq, gk = torch.randn_like(q), torch.randn_like(k)
    qr, kr = q.clone().requires_grad_(), k.clone().requires_grad_()
    torch.autograd.backward(rope(qr, kr, cos, sin, lay), (gq, gk))
    eq, ek = rope(gq, gk, cos, -sin, lay)
    assert qr.grad is not None
    assert kr.grad is not None
    torch.testing.assert_close(qr.grad, eq)
    torch.testing.assert_close(kr.grad, ek)


def test_float64_gradcheck_and_opcheck() -> None:
    (q, k, cos, sin), lay = _sample([1, 3, 2, 4, 1], torch.float64, seed=3)
    assert torch.autograd.gradcheck(
        lambda a, b: rope(a, b, cos, sin, lay), (q.requires_grad_(), k.requires_grad_()), fast_mode=True
    )
    (q, k, cos, sin), lay = _sample([1, 5, 2, 8, 0], torch.float32, seed=4)
    torch.library.opcheck(torch.ops.opgate.rope.default, (q, k, cos, sin, lay))


def test_zero_batch() -> None:
    q = torch.empty((0, 5, 2, 8), requires_grad=True, device=DEVICE)
    k = torch.empty((0, 5, 1, 8), requires_grad=True, device=DEVICE)
    cos, sin = ref.rope_tables(5, 8, torch.float32, DEVICE)
    qo, ko = rope(q, k, cos, sin, "bshd")
    assert qo.shape == q.shape
    assert ko.shape == k.shape
    (qo.sum() + ko.sum()).backward()
    assert q.grad is not None
    assert q.grad.shape == q.shape


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"layout": "sbhd"}, "layout must be one of"),
        ({"d": 7}, "head dim must be even"),
        ({"cos_seq": 4}, "cos must be"),
    ],
)
def test_bad_input_raises_clear_error(kwargs: dict[str, object], match: str) -> None:
    d = int(str(kwargs.get("d", 8)))
    q = torch.ones(1, 5, 2, d, device=DEVICE)
    cos = torch.ones(int(str(kwargs.get("cos_seq", 5))), d, device=DEVICE)
    with pytest.raises(RuntimeError, match=match):
        rope(q, q, cos, torch.ones(5, d, device=DEVICE), str(kwargs.get("layout", "bshd")))


def test_gradient_for_tables_is_refused() -> None:
    (q, k, cos, sin), lay = _sample([1, 3, 2, 4, 0], torch.float32, seed=5)
    qo, _ = rope(q, k, cos.requires_grad_(), sin, lay)
    with pytest.raises(NotImplementedError, match="cos/sin"):
        qo.sum().backward()
