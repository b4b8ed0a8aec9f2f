"""test_schema's output-alias report: a real alias stands, two distinct empty outputs are no alias.

On the H200 image (torch 2.11, CUDA) opcheck reported the two outputs of a
correct op as aliases in every zero-size cell: both are empty, both have data
pointer 0.  CPU torch does not reproduce that report, so the empty case hands
:func:`empty_alias` the message torch 2.11 raised there, with the op's real
outputs; the alias case gets a real report from opcheck.
"""

from __future__ import annotations

import torch

from opgate.ops.base import SampleInput
from opgate.validators.checks.opcheck import empty_alias

_LIB = torch.library.Library("opgate_alias_test", "DEF")
_LIB.define("view_pair(Tensor x) -> (Tensor, Tensor)")
_LIB.define("two_new(Tensor x) -> (Tensor, Tensor)")


def _view_pair(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    y = x * 2
    return y, y.view(y.shape)  # the second output is a view of the first: a real alias


def _two_new(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x * 2, x * 3


_LIB.impl("view_pair", _view_pair, "CompositeExplicitAutograd")
_LIB.impl("two_new", _two_new, "CompositeExplicitAutograd")
VIEW_PAIR = torch.ops.opgate_alias_test.view_pair.default
TWO_NEW = torch.ops.opgate_alias_test.two_new.default
H200_REPORT = RuntimeError("Outputs 0 and 1 alias unexpectedly")


def _schema(op: torch._ops.OpOverload, x: torch.Tensor) -> object:
    return torch.library.opcheck(op, (x,), test_utils=("test_schema",), raise_exception=False)["test_schema"]


def test_a_real_alias_is_reported_and_stands() -> None:
    sample = SampleInput(args=(torch.randn(4, 8),))
    outcome = _schema(VIEW_PAIR, sample.args[0])
    assert isinstance(outcome, RuntimeError)
    assert "Outputs 0 and 1 alias unexpectedly" in str(outcome)
    assert empty_alias(VIEW_PAIR, sample, outcome) is None


def test_distinct_empty_outputs_are_no_alias() -> None:
    sample = SampleInput(args=(torch.randn(0, 8),))
    assert _schema(TWO_NEW, sample.args[0]) == "SUCCESS"  # a correct op: CPU torch agrees
    note = empty_alias(TWO_NEW, sample, H200_REPORT)
    assert note is not None
    assert "outputs 0 and 1" in note
    assert "hold no elements" in note
    assert "(0, 8)" in note


def test_outputs_with_elements_or_other_failures_are_not_excused() -> None:
    full = SampleInput(args=(torch.randn(2, 8),))
    assert empty_alias(TWO_NEW, full, H200_REPORT) is None  # non-empty: only opcheck can be right
    empty = SampleInput(args=(torch.randn(0, 8),))
    assert empty_alias(TWO_NEW, empty, RuntimeError("Argument x is mutated")) is None
    assert empty_alias(TWO_NEW, empty, RuntimeError("Outputs 0 and 5 alias unexpectedly")) is None
    same = torch.empty(0, 8)
    assert empty_alias(lambda x: (same, same), empty, H200_REPORT) is None  # one tensor returned twice
