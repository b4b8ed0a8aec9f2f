"""A cell's inputs: every request gets its own copy of what the sample function drew once.

The sample function runs once per (dtype, shapes); requests get deep copies, so a check
that writes into its inputs never disturbs another check's, and views of one storage
stay views of one storage with their strides and offsets.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from opgate.ops.base import SampleInput
from opgate.validators.checks import context
from opgate.validators.checks.context import CellContext, build_context
from tests.zoo.harness import make_cell, specs


class CountingSamples:
    """A sample function that counts its calls; q and k are views of one qkv buffer."""

    def __init__(self, *, non_leaf: bool = False) -> None:
        self.calls = 0
        self.non_leaf = non_leaf

    def __call__(
        self, shape: tuple[int, ...], dtype: torch.dtype, device: str, generator: torch.Generator
    ) -> SampleInput:
        self.calls += 1
        n, d = shape
        qkv = torch.randn((n, 3 * d), generator=generator).to(device=device, dtype=dtype)
        if self.non_leaf:
            qkv = qkv.requires_grad_(True) * 1.0  # a non-leaf: torch cannot deep-copy it
        q, k = qkv[:, :d], qkv[:, d : 2 * d]
        return SampleInput(args=(q, k), kwargs={"scale": 0.5}, layout_args=(0, 1))


def _ctx(tmp_path: Path, samples: CountingSamples) -> CellContext:
    cell = make_cell("zoo_good", "fp32", "contiguous", "eager")
    ctx = build_context(cell, specs()["zoo_good"], "cpu", 7, tmp_path)
    return dataclasses.replace(ctx, sample_fn=samples, shapes=[(4, 8), (3, 16)])


def test_the_sample_function_runs_once_and_each_request_gets_its_own_storage(tmp_path: Path) -> None:
    fn = CountingSamples()
    ctx = _ctx(tmp_path, fn)
    first, second = ctx.samples(), ctx.samples()
    assert fn.calls == 2  # one call per shape, for the first request only
    for a, b in zip(first, second, strict=True):
        for x, y in zip(a.args, b.args, strict=True):
            assert torch.equal(x, y)
            assert x.untyped_storage().data_ptr() != y.untyped_storage().data_ptr()
    first[0].args[0].fill_(99.0)  # a check (or an op) writing into its inputs
    third = ctx.samples()
    assert torch.equal(third[0].args[0], second[0].args[0])
    assert fn.calls == 2


def test_copies_keep_views_of_one_storage_with_their_strides_and_offsets(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path, CountingSamples())
    ctx.samples()
    q, k = ctx.samples()[0].args
    assert q.untyped_storage().data_ptr() == k.untyped_storage().data_ptr()
    assert (q.stride(), k.stride()) == ((24, 1), (24, 1))
    assert (q.storage_offset(), k.storage_offset()) == (0, 8)
    k.fill_(-1.0)
    assert q.untyped_storage().nbytes() == 4 * 24 * 4
    assert torch.all(torch.as_strided(q, (4, 8), (24, 1), 8) == -1.0)


def test_a_copy_equals_a_fresh_draw_from_the_seed(tmp_path: Path) -> None:
    fn = CountingSamples()
    ctx = _ctx(tmp_path, fn)
    ctx.samples()
    again = ctx.samples()
    fresh = _ctx(tmp_path, CountingSamples()).samples()
    for a, b in zip(again, fresh, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a.args, b.args, strict=True))
        assert a.kwargs == b.kwargs


def test_other_dtypes_and_shapes_are_drawn_for_themselves(tmp_path: Path) -> None:
    fn = CountingSamples()
    ctx = _ctx(tmp_path, fn)
    ctx.samples()
    wide = ctx.samples(dtype=torch.float64)
    one = ctx.samples(shapes=[(3, 16)])
    assert wide[0].args[0].dtype == torch.float64
    assert one[0].args[0].shape == (3, 16)
    assert fn.calls == 2 + 2 + 1
    ctx.samples(dtype=torch.float64)
    ctx.samples(shapes=[(3, 16)])
    assert fn.calls == 5


def test_samples_that_cannot_be_copied_are_drawn_on_every_request(tmp_path: Path) -> None:
    fn = CountingSamples(non_leaf=True)
    ctx = _ctx(tmp_path, fn)
    a, b = ctx.samples(), ctx.samples()
    assert fn.calls == 4
    assert torch.equal(a[0].args[0], b[0].args[0])


def test_samples_without_a_storage_to_measure_are_drawn_on_every_request(tmp_path: Path) -> None:
    """A sparse tensor deep-copies but has no storage to size: drawn again, never an error."""
    calls = {"n": 0}

    def sparse(shape: tuple[int, ...], dtype: torch.dtype, device: str, gen: torch.Generator) -> SampleInput:
        calls["n"] += 1
        dense = torch.randn(shape, generator=gen).to(device=device, dtype=dtype)
        return SampleInput(args=(dense.to_sparse(),), layout_args=())

    cell = make_cell("zoo_good", "fp32", "contiguous", "eager")
    ctx = dataclasses.replace(
        build_context(cell, specs()["zoo_good"], "cpu", 7, tmp_path), sample_fn=sparse, shapes=[(4, 8)]
    )
    a, b = ctx.samples(), ctx.samples()
    assert calls["n"] == 2
    assert torch.equal(a[0].args[0].to_dense(), b[0].args[0].to_dense())


def test_samples_over_the_size_limit_are_not_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(context, "KEEP_BYTES", 100)
    fn = CountingSamples()
    ctx = _ctx(tmp_path, fn)
    a, b = ctx.samples(), ctx.samples()
    assert fn.calls == 4
    assert torch.equal(a[1].args[1], b[1].args[1])


def test_inputs_in_a_layout_are_built_from_copies(tmp_path: Path) -> None:
    cell = make_cell("zoo_good", "fp32", "transposed", "eager")
    ctx = build_context(cell, specs()["zoo_good"], "cpu", 7, tmp_path)
    calls = {"n": 0}
    real = ctx.sample_fn

    def counted(*args: object) -> SampleInput:
        calls["n"] += 1
        return real(*args)

    ctx = dataclasses.replace(ctx, sample_fn=counted)
    first, second = ctx.inputs(), ctx.inputs()
    assert calls["n"] == len(ctx.shapes)
    for a, b in zip(first, second, strict=True):
        x, y = a.args[0], b.args[0]
        assert torch.equal(x, y)
        assert x.stride() == y.stride()
        assert not x.is_contiguous()
        assert x.data_ptr() != y.data_ptr()
