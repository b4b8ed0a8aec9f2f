"""Generated layouts: same values, really different memory, and refused where impossible."""

from __future__ import annotations

import math

import pytest
import torch

from opgate.matrix.cell import LAYOUTS
from opgate.ops.base import SampleInput
from opgate.validators.layouts import (
    MISALIGN_ELEMENTS,
    OFFSET_ELEMENTS,
    VECTOR_ALIGN,
    LayoutError,
    apply_layout,
    describe,
    zero_size_variants,
)


def sample(shape: tuple[int, ...] = (6, 10), dtype: torch.dtype = torch.float32) -> SampleInput:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=gen).to(dtype)
    w = torch.randn(shape[-1], generator=gen).to(dtype)
    return SampleInput(args=(x, w, 0.5), kwargs={"eps": 1e-6}, layout_args=(0,), broadcastable=(0,))


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided", "offset", "misaligned"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_value_preserving_layouts_keep_values_and_untouched_args(layout: str, dtype: torch.dtype) -> None:
    s = sample(dtype=dtype)
    out = apply_layout(s, layout)
    x = out.args[0]
    assert x.shape == s.args[0].shape
    assert x.dtype == dtype
    assert torch.equal(x, s.args[0])
    assert out.args[1] is s.args[1]  # not a layout arg
    assert out.args[2] == 0.5
    assert out.kwargs == s.kwargs


def test_transposed_has_transposed_strides() -> None:
    x = apply_layout(sample((6, 10)), "transposed").args[0]
    assert x.stride() == (1, 6)
    assert not x.is_contiguous()


def test_transposed_3d_swaps_last_two_dims_only() -> None:
    x = apply_layout(sample((2, 3, 4)), "transposed").args[0]
    assert x.shape == (2, 3, 4)
    assert x.stride() == (12, 1, 3)


def test_strided_slice_of_double_width_buffer_with_nan_gaps() -> None:
    x = apply_layout(sample((6, 10)), "strided").args[0]
    assert x.stride() == (20, 2)
    base = torch.as_strided(x, (6, 20), (20, 1), x.storage_offset())
    assert torch.isnan(base[:, 1::2]).all()  # what a stride-ignoring kernel would read
    assert torch.isfinite(x).all()


def test_offset_is_contiguous_with_nan_prefix() -> None:
    x = apply_layout(sample((6, 10)), "offset").args[0]
    assert x.is_contiguous()
    assert x.storage_offset() == OFFSET_ELEMENTS
    prefix = torch.as_strided(x, (OFFSET_ELEMENTS,), (1,), 0)
    assert torch.isnan(prefix).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_misaligned_base_pointer(dtype: torch.dtype) -> None:
    x = apply_layout(sample((6, 10), dtype), "misaligned").args[0]
    assert x.storage_offset() == MISALIGN_ELEMENTS
    assert x.data_ptr() % VECTOR_ALIGN != 0
    assert x.is_contiguous()


def test_broadcast_is_stride_zero_on_broadcastable_args_only() -> None:
    s = sample((6, 10))
    out = apply_layout(s, "broadcast")
    x = out.args[0]
    assert x.stride(0) == 0
    assert x.shape == (6, 10)
    assert torch.equal(x[3], s.args[0][0])
    assert out.args[1] is s.args[1]


def test_broadcast_needs_a_broadcastable_arg() -> None:
    s = SampleInput(args=(torch.ones(4, 4),), layout_args=(0,), broadcastable=())
    with pytest.raises(LayoutError, match="broadcastable"):
        apply_layout(s, "broadcast")


def test_zero_size_empties_the_leading_dim() -> None:
    out = apply_layout(sample((6, 10)), "zero_size")
    assert out.args[0].shape == (0, 10)
    assert out.args[1].shape == (10,)


def test_zero_size_variants_all_batch_operands_then_the_first_only() -> None:
    a, b = torch.ones(4, 6), torch.ones(6, 3)
    mm = SampleInput(args=(a, b), layout_args=(0, 1))
    assert zero_size_variants(mm) == [(0, 1), (0,)]
    first_only = apply_layout(mm, "zero_size", targets=(0,))
    assert first_only.args[0].shape == (0, 6)
    assert first_only.args[1].shape == (6, 3)
    assert zero_size_variants(SampleInput(args=(a,), layout_args=(0,))) == [(0,)]


@pytest.mark.parametrize(
    ("shape", "layout"),
    [((10,), "transposed"), ((1, 10), "transposed"), ((6, 1), "strided"), ((1, 10), "broadcast")],
)
def test_impossible_layouts_are_refused_not_faked(shape: tuple[int, ...], layout: str) -> None:
    """A layout that would come out contiguous (size-1 dims) must not silently duplicate 'contiguous'."""
    s = SampleInput(args=(torch.ones(shape),), layout_args=(0,), broadcastable=(0,))
    with pytest.raises(LayoutError):
        apply_layout(s, layout)


def test_unknown_layout_and_non_tensor_target() -> None:
    with pytest.raises(LayoutError, match="unknown layout"):
        apply_layout(sample(), "diagonal")
    s = SampleInput(args=(1.0,), layout_args=(0,))
    with pytest.raises(LayoutError, match="not a tensor"):
        apply_layout(s, "transposed")


def test_every_layout_in_the_axis_vocabulary_is_generated() -> None:
    s = sample((6, 10))
    for layout in LAYOUTS:
        x = apply_layout(s, layout).args[0]
        assert isinstance(x, torch.Tensor)
        assert math.prod(x.shape) in (0, 60)


def test_layouts_are_fresh_tensors() -> None:
    s = sample()
    a, b = apply_layout(s, "strided").args[0], apply_layout(s, "strided").args[0]
    assert a.data_ptr() != b.data_ptr()


def test_describe() -> None:
    x = apply_layout(sample((6, 10)), "transposed").args[0]
    assert describe(x) == "float32[6, 10] stride=[1, 6] offset=0"
