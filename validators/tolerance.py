"""The tolerance rule: judge an op's numbers in ulps of its output dtype, against what the reference achieves.

Three results are compared on identical inputs: the op, the reference in the
same dtype, and the *oracle* (the reference run in float64, see
:mod:`validators.checks.oracle`).  Every element's distance to the oracle is
measured in units of the output dtype's ulp (unit in the last place) at the
oracle's magnitude there, floored at one ulp of the tensor's typical magnitude::

    u_i      = max(ulp_dtype(|oracle_i|), eps_dtype * rms(oracle))
    ulps(a)  = max_i |a_i - oracle_i| / u_i          (over positions where the oracle is finite)
    pass    <=> ulps(op) <= k * ulps(ref) + SLACK_ULPS
                or max_i |op_i - oracle_i| <= k * atol_floor
            and op is finite wherever the oracle is finite

Why ulps per element: rounding errors are quantised in ulps, and an ulp's size
doubles at every power of two.  A rule on absolute maxima (the op's worst
error within ``k`` times the reference's) compares errors that land in
whichever binade the largest elements happen to fall into on this seed, and
divides two numbers that are both a small multiple of one ulp: a correct
kernel that rounds once more than the reference (Liger's RMSNorm and Hugging
Face's LlamaRMSNorm cast ``x * rstd`` to the input dtype before ``* w``) is
exactly one ulp off where the reference is half an ulp off, and passes or fails
by the seed.  In ulps at each element's own magnitude, a correctly rounded
result is at most 0.5 ulp off on every element, one extra rounding adds at
most about one ulp, and the maximum over thousands of elements sits at that
bound on every seed.

Why the floor at ``eps * rms(oracle)``: a kernel's rounding errors scale with
the magnitude of its intermediates, i.e. of the data, not of each output
element.  Where an output is much smaller than the data (cancellation: ``q1 *
cos - q2 * sin`` in RoPE, a centred LayerNorm output near ``-b``, a weight
gradient summed over rows of both signs), one ulp of the data is an honest
rounding, and counting it in ulps of the tiny output would turn float32 noise
into hundreds of "ulps" that differ by seed.  The floor is ``eps * rms``, not
``ulp(rms)``: the latter halves or doubles when the rms crosses a power of two
from one seed to the next.

Measured over 50 seeds (tests/test_tolerance_seeds.py and the ulp study it
replaced): correctly rounded ops sit at 0.5 ulp, double-rounding ones (Hugging
Face's LlamaRMSNorm and its autograd, Liger-style ``silu(a).to(dtype) * b``,
RoPE in the input dtype) at 1.1-2.3 ulp, i.e. below 0.8 of the bound on every
seed; bf16 accumulation lands at 13-15 ulp, a dropped backward term at 7-480.
One seed per cell is then enough: the verdict does not depend on it.

Why ``k * ref + SLACK_ULPS``: the slack (a few ulps, fixed) absorbs extra
roundings that a correct kernel may do; the ``k *`` term keeps a reference
that is itself inexact (several low-precision roundings, long float32
reductions) from failing ops that are as good as it.  Broken kernels move the
error far beyond both: wrong strides or offsets are off by the data's size
(hundreds of ulps), lost accumulation precision by tens of ulps, a wrong
backward by tens to thousands, unwritten elements are NaN.

``atol_floor`` is an absolute bound below which no error is judged, for
outputs where the ulp is far below any meaningful error (float32 outputs of a
float32 reference, whose errors are a few float32 ulps).

Non-finite values are judged separately: a NaN/Inf where the oracle is finite
is a failure whatever the magnitudes (that is how poisoned, unwritten output
elements show up).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree

#: The reference must be this many times further from the oracle than the op to flag ``baseline_worse``.
BASELINE_MARGIN = 2.0
#: Extra ulps any op may have beyond ``k`` times the reference's: room for a few extra roundings.
SLACK_ULPS = 2.0


@dataclass(frozen=True)
class Rule:
    """``k``, ``atol_floor`` and the slack of the tolerance rule (see the module docstring)."""

    k: float
    atol_floor: float
    slack_ulps: float = SLACK_ULPS

    def to_json(self) -> dict[str, float]:
        return {"k": self.k, "atol_floor": self.atol_floor, "slack_ulps": self.slack_ulps}


@dataclass(frozen=True)
class Comparison:
    """One output (or gradient) judged by the rule.

    ``op_err``/``ref_err`` are absolute maxima; ``op_ulps``/``ref_ulps`` the
    maxima in ulps, ``allowed_ulps`` the bound; ``scale`` = max |oracle|,
    ``floor`` the magnitude below which ulps are taken at the floor.
    """

    label: str
    passed: bool
    op_err: float
    ref_err: float
    allowed: float
    scale: float
    op_nonfinite: int = 0
    ref_nonfinite: int = 0
    oracle_nonfinite: int = 0
    numel: int = 0
    atol_floor: float = 0.0
    worst_index: tuple[int, ...] | None = None
    #: (op, reference, oracle) at ``worst_index``: what a reader checks first ("off by one ulp" vs "garbage")
    worst_values: tuple[float, float, float] | None = None
    problem: str = ""
    op_ulps: float = 0.0
    ref_ulps: float = 0.0
    allowed_ulps: float = 0.0
    slack_ulps: float = 0.0
    floor: float = 0.0
    dtype: str = ""
    k: float = 0.0

    @property
    def baseline_worse(self) -> bool:
        """The reference is clearly further from the oracle than the op: the baseline is the weak one."""
        if self.problem or self.op_nonfinite:
            return False
        return (
            self.ref_err > self.atol_floor
            and self.ref_ulps > 1.0
            and self.ref_ulps > BASELINE_MARGIN * self.op_ulps
        )

    @property
    def margin(self) -> float:
        """op_ulps / allowed_ulps: how close to the bound (above 1 fails unless the absolute floor holds)."""
        return self.op_ulps / self.allowed_ulps if self.allowed_ulps > 0 else 0.0

    def _rel(self, err: float) -> float:
        return err / self.scale if self.scale > 0 else err

    def summary(self) -> str:
        if self.problem:
            return f"{self.label}: {self.problem}"
        if self.op_nonfinite:
            return f"{self.label}: {self.op_nonfinite} non-finite value(s) where the oracle is finite"
        verb = "<=" if self.passed else ">"
        line = (
            f"{self.label}: err {self.op_ulps:.3g} ulp (abs {self.op_err:.3g}, "
            f"rel {self._rel(self.op_err):.2g}) {verb} allowed {self.allowed_ulps:.3g} ulp"
        )
        if self.ref_ulps > 0:
            line += f" = {self.k:g} x reference {self.ref_ulps:.3g} ulp + {self.slack_ulps:g} slack"
        else:
            line += f" (reference exact; {self.slack_ulps:g} slack)"
        if self.passed and self.op_ulps > self.allowed_ulps:
            line += f"; abs err within {self.allowed:.3g} (atol_floor)"
        return line

    def details(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "passed": self.passed,
            "dtype": self.dtype,
            "op_ulps": self.op_ulps,
            "ref_ulps": self.ref_ulps,
            "allowed_ulps": self.allowed_ulps,
            "slack_ulps": self.slack_ulps,
            "ulp_floor": self.floor,
            "op_err": self.op_err,
            "ref_err": self.ref_err,
            "op_rel_err": self._rel(self.op_err),
            "ref_rel_err": self._rel(self.ref_err),
            "allowed": self.allowed,
            "oracle_max_abs": self.scale,
            "op_nonfinite": self.op_nonfinite,
            "ref_nonfinite": self.ref_nonfinite,
            "oracle_nonfinite": self.oracle_nonfinite,
            "numel": self.numel,
            "worst_index": list(self.worst_index) if self.worst_index is not None else None,
            "worst_values": _values_json(self.worst_values),
            "baseline_worse": self.baseline_worse,
            "problem": self.problem,
        }


def _values_json(values: tuple[float, float, float] | None) -> dict[str, float | str] | None:
    """The worst element's values for JSON: NaN and infinities as text (JSON has no literal for them)."""
    if values is None:
        return None
    return {
        name: v if math.isfinite(v) else str(v)
        for name, v in zip(("op", "reference", "oracle"), values, strict=True)
    }


def ulp(magnitude: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of ``dtype`` at each ``magnitude`` (float64 in, float64 out); 1 for integer dtypes.

    ``2**(e - 1) * eps`` for ``magnitude = m * 2**e``, ``m`` in [0.5, 1); below the
    smallest normal number (zero included) the spacing of the subnormals.
    """
    if not dtype.is_floating_point:
        return torch.ones_like(magnitude)
    info = torch.finfo(dtype)
    subnormal = info.smallest_normal * info.eps
    _, exponent = torch.frexp(magnitude)
    spacing = torch.ldexp(torch.full_like(magnitude, info.eps), exponent - 1)
    return torch.where(magnitude < info.smallest_normal, torch.full_like(magnitude, subnormal), spacing)


def _masked_max(values: torch.Tensor, where: torch.Tensor) -> tuple[float, int]:
    """(max of ``values`` over ``where``, flat index of it); (0, -1) if nothing to compare."""
    if not bool(where.any()):
        return 0.0, -1
    masked = torch.where(where, values, torch.zeros((), dtype=values.dtype, device=values.device))
    flat = int(masked.reshape(-1).argmax())
    return float(masked.reshape(-1)[flat]), flat


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    index = []
    for size in reversed(shape):
        index.append(flat % size)
        flat //= size
    return tuple(reversed(index))


def _refused(label: str, problem: str) -> Comparison:
    return Comparison(label, False, 0.0, 0.0, 0.0, 0.0, problem=problem)


def compare_tensor(op: Any, ref: Any, oracle: Any, rule: Rule, label: str = "output") -> Comparison:
    """Judge one tensor of the op against the reference and the oracle."""
    if not isinstance(oracle, torch.Tensor):
        same = op == oracle
        return Comparison(
            label, bool(same), 0.0, 0.0, 0.0, 0.0, problem="" if same else f"{op!r} != {oracle!r}"
        )
    if not isinstance(op, torch.Tensor):
        return _refused(label, f"op returned {type(op).__name__}, not a tensor")
    if tuple(op.shape) != tuple(oracle.shape):
        return _refused(label, f"shape {tuple(op.shape)} != expected {tuple(oracle.shape)}")
    if isinstance(ref, torch.Tensor) and op.dtype != ref.dtype:
        return _refused(label, f"dtype {op.dtype} != reference {ref.dtype}")
    o64 = oracle.detach().to(torch.float64)
    a64 = op.detach().to(device=o64.device, dtype=torch.float64)
    r64 = ref.detach().to(device=o64.device, dtype=torch.float64) if isinstance(ref, torch.Tensor) else o64
    finite = torch.isfinite(o64)
    op_bad = finite & ~torch.isfinite(a64)
    ref_bad = finite & ~torch.isfinite(r64)
    mags = o64.abs()
    scale = float(mags[finite].max()) if bool(finite.any()) else 0.0
    rms = float(mags[finite].pow(2).mean().sqrt()) if bool(finite.any()) else 0.0
    floor = rms * torch.finfo(op.dtype).eps if op.dtype.is_floating_point else 0.0
    unit = ulp(torch.where(finite, mags, torch.zeros_like(mags)), op.dtype).clamp_min(floor)
    op_abs = torch.where(finite & ~op_bad, (a64 - o64).abs(), torch.zeros_like(o64))
    ref_abs = torch.where(finite & ~ref_bad, (r64 - o64).abs(), torch.zeros_like(o64))
    op_err, _ = _masked_max(op_abs, finite & ~op_bad)
    ref_err, _ = _masked_max(ref_abs, finite & ~ref_bad)
    op_ulps, op_at = _masked_max(op_abs / unit, finite & ~op_bad)
    ref_ulps, _ = _masked_max(ref_abs / unit, finite & ~ref_bad)
    slack = rule.slack_ulps if op.dtype.is_floating_point else 0.0
    allowed_ulps = rule.k * ref_ulps + slack
    allowed = rule.k * rule.atol_floor
    n_op_bad = int(op_bad.sum())
    if n_op_bad:
        op_at = int(op_bad.reshape(-1).nonzero()[0])
    worst = None
    if op_at >= 0:
        at = (op_at,)
        worst = (float(a64.reshape(-1)[at]), float(r64.reshape(-1)[at]), float(o64.reshape(-1)[at]))
    return Comparison(
        label=label,
        passed=n_op_bad == 0 and (op_ulps <= allowed_ulps or op_err <= allowed),
        op_err=op_err,
        ref_err=ref_err,
        allowed=allowed,
        scale=scale,
        op_nonfinite=n_op_bad,
        ref_nonfinite=int(ref_bad.sum()),
        oracle_nonfinite=int((~finite).sum()),
        numel=o64.numel(),
        atol_floor=rule.atol_floor,
        worst_index=_unravel(op_at, tuple(o64.shape)) if op_at >= 0 else None,
        worst_values=worst,
        op_ulps=op_ulps,
        ref_ulps=ref_ulps,
        allowed_ulps=allowed_ulps,
        slack_ulps=slack,
        floor=floor,
        dtype=str(op.dtype).removeprefix("torch."),
        k=rule.k,
    )


def compare(
    op_out: Any, ref_out: Any, oracle_out: Any, rule: Rule, label: str = "output"
) -> list[Comparison]:
    """Judge every tensor leaf of an op's output (tensors, tuples, lists, dicts) by the rule."""
    op_leaves, op_spec = pytree.tree_flatten(op_out)
    ref_leaves, _ = pytree.tree_flatten(ref_out)
    oracle_leaves, oracle_spec = pytree.tree_flatten(oracle_out)
    if op_spec != oracle_spec or len(ref_leaves) != len(oracle_leaves):
        return [_refused(label, f"output structure {op_spec} != reference structure {oracle_spec}")]
    multi = len(oracle_leaves) > 1
    return [
        compare_tensor(o, r, g, rule, f"{label}[{i}]" if multi else label)
        for i, (o, r, g) in enumerate(zip(op_leaves, ref_leaves, oracle_leaves, strict=True))
    ]
