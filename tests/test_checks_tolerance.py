"""The tolerance rule: per-element ulps, ``op <= k * ref + slack``, an absolute floor, NaN judged apart."""

from __future__ import annotations

import pytest
import torch

from opgate.validators.tolerance import BASELINE_MARGIN, SLACK_ULPS, Rule, compare, compare_tensor, ulp

RULE = Rule(k=2.0, atol_floor=1e-5)
BF16 = torch.bfloat16


def oracle(n: int = 4000, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn((n // 100, 100), generator=g, dtype=torch.float64) * 3


def nudged(t: torch.Tensor, o: torch.Tensor, ulps: float, at: tuple[int, int] | None = None) -> torch.Tensor:
    """``t`` moved by ``ulps`` of its dtype at the oracle ``o``'s (floored) magnitudes, or at one element."""
    wide = t.double()
    floor = float(o.pow(2).mean().sqrt()) * torch.finfo(t.dtype).eps
    step = ulps * ulp(o.abs(), t.dtype).clamp_min(floor)
    if at is not None:
        step = torch.zeros_like(wide).index_put_((torch.tensor([at[0]]), torch.tensor([at[1]])), step[at])
    return (wide + step).to(t.dtype)


def test_ulp_is_the_dtype_spacing_at_the_magnitude() -> None:
    mags = torch.tensor([1.0, 1.5, 0.75, 8.0, 0.0], dtype=torch.float64)
    assert ulp(mags, BF16).tolist()[:4] == [2**-7, 2**-7, 2**-8, 2**-4]
    assert ulp(mags, torch.float16)[0] == 2**-10
    assert ulp(mags, torch.float32)[0] == 2**-23
    info = torch.finfo(BF16)
    assert ulp(mags, BF16)[4] == info.smallest_normal * info.eps  # never zero
    assert ulp(mags, torch.int32).tolist() == [1.0] * 5


def test_correct_rounding_is_half_an_ulp_and_passes() -> None:
    o = oracle()
    c = compare_tensor(o.to(BF16), o.to(BF16), o, RULE)
    assert c.passed
    assert c.op_ulps == pytest.approx(0.5, abs=0.01)
    assert c.allowed_ulps == pytest.approx(2 * c.ref_ulps + SLACK_ULPS)
    assert "ulp" in c.summary()
    assert "slack" in c.summary()
    assert c.details()["slack_ulps"] == SLACK_ULPS
    assert c.details()["dtype"] == "bfloat16"


def test_one_extra_rounding_never_fails() -> None:
    """Double rounding (Liger / HF LlamaRMSNorm) is about one ulp where the reference is half of one."""
    o = oracle()
    ref = o.to(BF16)
    for sign in (1.0, -1.0):
        c = compare_tensor(nudged(ref, o, sign), ref, o, RULE)
        assert c.passed, c.summary()
        assert 1.0 <= c.op_ulps <= 2.0  # the nudge, plus rounding it back onto the bf16 grid


def test_the_bound_is_k_times_the_reference_plus_the_slack() -> None:
    o = oracle()
    ref = o.to(BF16)
    allowed = 2 * compare_tensor(ref, ref, o, RULE).ref_ulps + SLACK_ULPS
    assert compare_tensor(nudged(ref, o, allowed - 1.0, at=(3, 7)), ref, o, RULE).passed
    failed = compare_tensor(nudged(ref, o, allowed + 1.0, at=(3, 7)), ref, o, RULE)
    assert not failed.passed
    assert failed.worst_index == (3, 7)
    assert "> allowed" in failed.summary()


def test_the_verdict_does_not_depend_on_the_binade_of_the_data() -> None:
    """Scaling the data moves the largest elements across a power of two: the ulps stay the same."""
    o = oracle()
    for scale in (1.0, 1.3, 1.7, 2.0, 0.6):
        so = o * scale
        sref = so.to(BF16)
        c = compare_tensor(nudged(sref, so, 1.0), sref, so, RULE)
        assert c.passed
        assert 1.0 <= c.op_ulps <= 2.0
        assert c.ref_ulps == pytest.approx(0.5, abs=0.01)


def test_small_elements_are_measured_at_the_data_magnitude() -> None:
    """An error of one ulp of the data's rms at a near-zero output is one ulp, not thousands."""
    o = oracle()
    o[0, 0] = 1e-4
    ref = o.to(BF16)
    rms = float(o.pow(2).mean().sqrt())
    op = ref.clone()
    op[0, 0] = float(o[0, 0]) + rms * torch.finfo(BF16).eps
    c = compare_tensor(op, ref, o, RULE)
    assert c.passed
    assert c.op_ulps == pytest.approx(1.0, abs=0.05)
    assert c.floor == pytest.approx(rms * torch.finfo(BF16).eps)


def test_wrong_numbers_are_many_ulps_off() -> None:
    o = oracle()
    ref = o.to(BF16)
    c = compare_tensor((o * 1.04).to(BF16), ref, o, RULE)  # lost accumulation: 4 % high everywhere
    assert not c.passed
    assert c.op_ulps > 4 * c.allowed_ulps / 2
    swapped = compare_tensor(ref.flip(0), ref, o, RULE)  # wrong strides: someone else's elements
    assert not swapped.passed
    assert swapped.op_ulps > 100


def test_atol_floor_holds_where_ulps_are_far_below_any_meaningful_error() -> None:
    o = oracle()
    ref = o.float()
    op = (o + 5e-6).float()  # many float32 ulps, but 5e-6 absolute
    c = compare_tensor(op, ref, o, RULE)
    assert c.op_ulps > c.allowed_ulps
    assert c.passed
    assert "atol_floor" in c.summary()
    assert not compare_tensor((o + 5e-5).float(), ref, o, RULE).passed


def test_nan_where_oracle_is_finite_fails_whatever_the_magnitudes() -> None:
    o = oracle()
    op = o.to(BF16)
    op[5, 9] = float("nan")
    op[0, 0] = float("inf")
    c = compare_tensor(op, o.to(BF16), o, Rule(k=1e9, atol_floor=1e9))
    assert not c.passed
    assert c.op_nonfinite == 2
    assert c.worst_index == (0, 0)
    assert "2 non-finite" in c.summary()


def test_positions_where_the_oracle_is_not_finite_are_not_judged() -> None:
    o = oracle()
    o[1, 1] = float("inf")
    op = o.to(BF16)
    op[1, 1] = 123.0
    c = compare_tensor(op, o.to(BF16), o, RULE)
    assert c.passed
    assert c.oracle_nonfinite == 1


def test_shape_and_dtype_mismatch_fail() -> None:
    o = oracle()
    assert "shape" in compare_tensor(o[:5].to(BF16), o.to(BF16), o, RULE).problem
    c = compare_tensor(o.float(), o.to(BF16), o, RULE)
    assert not c.passed
    assert "dtype" in c.problem


def test_integer_outputs_must_be_exact() -> None:
    o = torch.arange(12, dtype=torch.float64).reshape(3, 4)
    exact = o.to(torch.int32)
    assert compare_tensor(exact.clone(), exact, o, RULE).passed
    off = exact.clone()
    off[0, 0] += 1
    assert not compare_tensor(off, exact, o, RULE).passed


def test_baseline_worse_is_flagged_only_with_a_clear_margin() -> None:
    o = oracle()
    good = o.to(BF16)
    bad_ref = nudged(good, o, 3.0)
    better = compare_tensor(good, bad_ref, o, RULE)
    assert better.passed
    assert better.ref_ulps > BASELINE_MARGIN * better.op_ulps
    assert better.baseline_worse
    assert better.details()["baseline_worse"] is True
    assert not compare_tensor(nudged(good, o, 1.0), nudged(good, o, 1.0), o, RULE).baseline_worse
    tiny = compare_tensor(o.float(), (o + 1e-7).float(), o, RULE)
    assert not tiny.baseline_worse  # below the floor: nobody is "wrong"


def test_zero_size_outputs_pass() -> None:
    o = torch.empty(0, 10, dtype=torch.float64)
    c = compare_tensor(o.to(BF16), o.to(BF16), o, RULE)
    assert c.passed
    assert c.numel == 0


def test_tuple_outputs_are_judged_leaf_by_leaf() -> None:
    o = oracle()
    r = o.to(BF16)
    results = compare((r.clone(), (o + 1.0).to(BF16)), (r, r), (o, o), RULE, label="out")
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
    ref = o.clone()
    ref[1, 1] += 1e-3
    op = o.clone()
    op[2, 2] += 0.5
    failed = compare_tensor(op, ref, o, RULE)
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
