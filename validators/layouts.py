"""Memory layouts generated from an op's own sample inputs.

Why generated, not hand-listed: a layout bug (a kernel that assumes unit
strides, forgets the storage offset, or hides a ``.contiguous()``) only shows on
inputs whose *values* are ordinary but whose *memory* is not.  Every layout here
keeps the logical shape and values of the sample input (zero-size and broadcast
excepted, by definition) and changes only strides, offset or alignment, so the
reference and the float64 oracle see the very same numbers.

Bytes of a backing buffer that the view does *not* cover are filled with NaN:
a kernel that reads the gap of a strided slice or the prefix before a storage
offset produces NaN, which the correctness check reports as non-finite output.

Each generated tensor is checked to really have the intended strides, offset
or alignment (:class:`LayoutError` otherwise): a layout that silently came out
contiguous would turn a layout cell into a duplicate contiguous cell.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from opgate.matrix.cell import LAYOUTS
from opgate.ops.base import SampleInput

#: Storage offset (elements) of the ``offset`` layout: a multiple of 8 (16-byte aligned for every dtype),
#: and a value unlikely to equal a dim (equal ints share one symbol under torch.compile: a needless guard).
OFFSET_ELEMENTS = 40
#: Storage offset of the ``misaligned`` layout: one element, so the base pointer loses 16-byte alignment.
MISALIGN_ELEMENTS = 1
#: Alignment (bytes) the misaligned base pointer must break (vectorised loads need 16).
VECTOR_ALIGN = 16


class LayoutError(ValueError):
    """The layout cannot be realised for these inputs (e.g. ``transposed`` of a 1-d tensor)."""


def _nan_buffer(numel: int, like: torch.Tensor) -> torch.Tensor:
    buf = torch.empty(numel, dtype=like.dtype, device=like.device)
    if buf.is_floating_point() or buf.is_complex():
        buf.fill_(float("nan"))
    else:
        buf.fill_(-1)
    return buf


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for size in reversed(shape):
        strides.append(acc)
        acc *= max(size, 1)
    return tuple(reversed(strides))


def _at_offset(t: torch.Tensor, offset: int) -> torch.Tensor:
    """A contiguous copy of ``t`` placed ``offset`` elements into a NaN-filled buffer."""
    shape = tuple(t.shape)
    buf = _nan_buffer(offset + t.numel(), t)
    view = buf.as_strided(shape, _contiguous_strides(shape), offset)
    view.copy_(t)
    return view


def transposed(t: torch.Tensor) -> torch.Tensor:
    """Same shape, transposed storage: the last two dims are swapped in memory."""
    if t.dim() < 2 or t.shape[-1] < 2 or t.shape[-2] < 2:
        raise LayoutError(f"transposed needs the last two dims >= 2, got shape {tuple(t.shape)}")
    view = t.transpose(-1, -2).contiguous().transpose(-1, -2)
    if view.is_contiguous() or view.stride(-1) != t.shape[-2]:
        raise LayoutError(f"transposed view came out with strides {view.stride()}")
    return view


def strided(t: torch.Tensor) -> torch.Tensor:
    """``buf[..., ::2]`` of a buffer twice as wide; the odd columns hold NaN."""
    if t.dim() < 1 or t.shape[-1] < 2:
        raise LayoutError(f"strided needs a last dim >= 2, got shape {tuple(t.shape)}")
    wide = (*t.shape[:-1], 2 * t.shape[-1])
    buf = _nan_buffer(math.prod(wide), t).view(wide)
    view = buf[..., ::2]
    view.copy_(t)
    if view.stride(-1) != 2 or view.is_contiguous():
        raise LayoutError(f"strided view came out with strides {view.stride()}")
    return view


def offset(t: torch.Tensor, elements: int = OFFSET_ELEMENTS) -> torch.Tensor:
    """Contiguous, but starting ``elements`` into its storage (NaN before it)."""
    view = _at_offset(t, elements)
    if view.storage_offset() != elements or not view.is_contiguous():
        raise LayoutError(f"offset view has storage offset {view.storage_offset()}")
    return view


def misaligned(t: torch.Tensor) -> torch.Tensor:
    """Contiguous, one element into its storage: the base pointer is not 16-byte aligned."""
    if t.numel() == 0:
        raise LayoutError("misaligned needs a non-empty tensor")
    if t.element_size() % VECTOR_ALIGN == 0:
        raise LayoutError(f"a {t.dtype} element is a multiple of {VECTOR_ALIGN} bytes: cannot misalign")
    view = _at_offset(t, MISALIGN_ELEMENTS)
    if view.data_ptr() % VECTOR_ALIGN == 0:
        raise LayoutError(f"misaligned view landed on a {VECTOR_ALIGN}-byte boundary")
    return view


def broadcast(t: torch.Tensor) -> torch.Tensor:
    """Stride 0 along dim 0: row 0 of ``t`` expanded to the full shape (values change by design)."""
    if t.dim() < 1 or t.shape[0] < 2:
        raise LayoutError(f"broadcast needs a leading dim >= 2, got shape {tuple(t.shape)}")
    view = t.narrow(0, 0, 1).clone().expand(t.shape)
    if view.stride(0) != 0:
        raise LayoutError(f"broadcast view came out with strides {view.stride()}")
    return view


def zero_size(t: torch.Tensor) -> torch.Tensor:
    """The leading dim set to 0 (an empty batch)."""
    if t.dim() < 1:
        raise LayoutError("zero_size needs at least one dim")
    view = t.new_empty((0, *t.shape[1:]))
    if view.numel() != 0:
        raise LayoutError(f"zero_size view has {view.numel()} elements")
    return view


_MAKERS = {
    "transposed": transposed,
    "strided": strided,
    "offset": offset,
    "misaligned": misaligned,
    "broadcast": broadcast,
    "zero_size": zero_size,
}


def zero_size_variants(sample: SampleInput) -> list[tuple[int, ...]]:
    """Which args an empty batch empties, most to least: all layout args, then the first only.

    Same-batch operands (``x`` and ``residual``; ``q``, ``k``, ``v``) must all be
    emptied, but a contraction operand must not (``b`` of ``a @ b``): the caller
    keeps the first variant the reference accepts.
    """
    variants = [tuple(sample.layout_args), tuple(sample.layout_args[:1])]
    return [v for i, v in enumerate(variants) if v and v not in variants[:i]]


def apply_layout(sample: SampleInput, layout: str, targets: tuple[int, ...] | None = None) -> SampleInput:
    """A new SampleInput whose layout-receiving args have ``layout``; the others are untouched.

    ``broadcast`` applies to ``sample.broadcastable`` (the only args whose
    schema allows a stride-0 view); every other layout to ``sample.layout_args``
    (``targets`` overrides, e.g. a :func:`zero_size_variants` entry).
    """
    if layout not in LAYOUTS:
        raise LayoutError(f"unknown layout {layout!r}; known: {', '.join(LAYOUTS)}")
    if layout == "contiguous":
        return dataclasses.replace(sample, args=tuple(sample.args), kwargs=dict(sample.kwargs))
    if targets is None:
        targets = sample.broadcastable if layout == "broadcast" else sample.layout_args
    if not targets:
        which = "broadcastable" if layout == "broadcast" else "layout_args"
        raise LayoutError(f"{layout}: the sample input declares no {which}")
    args = list(sample.args)
    for i in targets:
        if i >= len(args) or not isinstance(args[i], torch.Tensor):
            raise LayoutError(f"{layout}: argument {i} is not a tensor")
        args[i] = _MAKERS[layout](args[i])
    return dataclasses.replace(sample, args=tuple(args), kwargs=dict(sample.kwargs))


def describe(t: torch.Tensor) -> str:
    """One-line memory description, for check details."""
    return (
        f"{str(t.dtype).replace('torch.', '')}{list(t.shape)} stride={list(t.stride())} "
        f"offset={t.storage_offset()}"
    )
