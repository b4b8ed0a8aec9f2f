"""The tolerance rule: err(op) <= k * max(err(ref), atol_floor), non-finite judged separately."""

from __future__ import annotations

import pytest
import torch

from opgate.validators.tolerance import BASELINE_MARGIN, Rule, compare, compare_tensor

RULE = Rule(k=2.0, atol_floor=1e-5)


def oracle() -> torch.Tensor:
    return torch.linspace(-3, 3, 60, dtype=torch.float64).reshape(6, 10)


def shifted(t: torch.Tensor, at: tuple[int, int], by: float) -> torch.Tensor:
    out = t.clone()
    out[at] += by
    return out


def test_identical_to_reference_passes() -> None:
    o = oracle()
    ref = shifted(o, (0, 0), 1e-3)
    c = compare_tensor(ref.clone(), ref, o, RULE)
    assert c.passed
    assert c.op_err == pytest.approx(1e-3)
    assert c.ref_err == pytest.approx(1e-3)
    assert c.allowed == pytest.approx(2e-3)
    assert not c.baseline_worse


def test_k_times_reference_error_is_the_boundary() -> None:
    o = oracle()
    ref = shifted(o, (1, 1), 1e-3)
    assert compare_tensor(shifted(o, (2, 2), 1.99e-3), ref, o, RULE).passed
    failed = compare_tensor(shifted(o, (2, 2), 2.01e-3), ref, o, RULE)
    assert not failed.passed
    assert failed.worst_index == (2, 2)
    assert "> allowed" in failed.summary()


def test_atol_floor_applies_where_the_reference_is_exact() -> None:
    o = oracle()
    assert compare_tensor(shifted(o, (0, 3), 1.5e-5), o.clone(), o, RULE).passed
    assert not compare_tensor(shifted(o, (0, 3), 3e-5), o.clone(), o, RULE).passed


def test_errors_are_measured_in_float64_from_low_precision_outputs() -> None:
    o = oracle()
    ref = o.to(torch.bfloat16)
    c = compare_tensor(ref.clone(), ref, o, RULE)
    assert c.passed
    assert c.ref_err > 0
    assert c.scale == pytest.approx(3.0)


def test_nan_where_oracle_is_finite_fails_whatever_the_magnitudes() -> None:
    o = oracle()
    op = o.clone()
    op[5, 9] = float("nan")
    op[0, 0] = float("inf")
    c = compare_tensor(op, o.clone(), o, Rule(k=1e9, atol_floor=1e9))
    assert not c.passed
    assert c.op_nonfinite == 2
    assert c.worst_index == (0, 0)
    assert "2 non-finite" in c.summary()


def test_positions_where_the_oracle_is_not_finite_are_not_judged() -> None:
    o = oracle()
    o[1, 1] = float("inf")
    op = o.clone()
    op[1, 1] = 123.0
    c = compare_tensor(op, o.clone(), o, RULE)
    assert c.passed
    assert c.oracle_nonfinite == 1


def test_shape_and_dtype_mismatch_fail() -> None:
    o = oracle()
    assert "shape" in compare_tensor(o[:5], o, o, RULE).problem
    c = compare_tensor(o.float(), o.to(torch.bfloat16), o, RULE)
    assert not c.passed
    assert "dtype" in c.problem


def test_baseline_worse_is_flagged_only_with_a_clear_margin() -> None:
    o = oracle()
    ref = shifted(o, (0, 0), 1e-2)
    better = compare_tensor(shifted(o, (0, 0), 1e-2 / (BASELINE_MARGIN + 1)), ref, o, RULE)
    assert better.passed
    assert better.baseline_worse
    assert better.details()["baseline_worse"] is True
    close = compare_tensor(shifted(o, (0, 0), 0.9e-2), ref, o, RULE)
    assert not close.baseline_worse
    tiny = compare_tensor(o.clone(), shifted(o, (0, 0), 1e-6), o, RULE)
    assert not tiny.baseline_worse  # below the floor: nobody is "wrong"


def test_zero_size_outputs_pass() -> None:
    o = torch.empty(0, 10, dtype=torch.float64)
    c = compare_tensor(o.float(), o.float(), o, RULE)
    assert c.passed
    assert c.numel == 0


def test_tuple_outputs_are_judged_leaf_by_leaf() -> None:
    o = oracle()
    results = compare((o.clone(), shifted(o, (0, 0), 1.0)), (o, o), (o, o), RULE, label="out")
    assert [c.label for c in results] == ["out[0]", "out[1]"]
    assert [c.passed for c in results] == [True, False]


def test_structure_mismatch_fails() -> None:
    o = oracle()
    (c,) = compare(o, (o, o), (o, o), RULE)
    assert not c.passed
    assert "structure" in c.problem


def test_non_tensor_op_output_fails() -> None:
    o = oracle()
    c = compare_tensor(3.0, o, o, RULE)
    assert not c.passed
    assert "not a tensor" in c.problem


def test_the_worst_elements_values_are_recorded_as_json_can_hold_them() -> None:
    o = oracle()
    ref = shifted(o, (1, 1), 1e-3)
    failed = compare_tensor(shifted(o, (2, 2), 0.5), ref, o, RULE)
    assert failed.worst_index == (2, 2)
    assert failed.details()["worst_values"] == {
        "op": pytest.approx(float(o[2, 2]) + 0.5),
        "reference": float(o[2, 2]),
        "oracle": float(o[2, 2]),
    }
    # a correct op still says where it is furthest off, and by how little
    ok = compare_tensor(ref.clone(), ref, o, RULE).details()
    assert ok["worst_index"] == [1, 1]
    assert ok["worst_values"]["op"] == ok["worst_values"]["reference"] == pytest.approx(float(o[1, 1]) + 1e-3)
    nan = o.clone()
    nan[3, 4] = float("nan")
    values = compare_tensor(nan, o.clone(), o, RULE).details()["worst_values"]
    assert values["op"] == "nan"
    assert isinstance(values["oracle"], float)
