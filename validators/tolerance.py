"""The tolerance rule: judge an op's numbers against what its dtype can achieve.

Three results are compared on identical inputs: the op, the reference in the
same dtype, and the *oracle* (the reference run on float64 upcasts).  The
reference's own distance to the oracle measures what this dtype, this shape and
this data allow; the op may be at most ``k`` times as far::

    err(a)  = max_i |a_i - oracle_i|            (over positions where the oracle is finite)
    pass   <=> err(op) <= k * max(err(ref), atol_floor)
            and op is finite wherever the oracle is finite

Why a normwise (max-abs) metric rather than a per-element rule such as
``|op_i - oracle_i| <= k |ref_i - oracle_i| + atol``: at many positions the
reference lands exactly on the rounded oracle (error 0), and an op that rounds
the other way there is one ulp off — an element-wise rule fails correct kernels
unless ``atol`` is raised to a dtype-sized magic number, which then hides real
bugs in small outputs.  The worst-case error of a correct kernel, by contrast,
is set by the same rounding steps as the reference's worst case, so the ratio
of the two maxima is stable across seeds; broken kernels (wrong strides, lost
accumulation precision, unwritten elements) move the maximum by orders of
magnitude.  ``atol_floor`` keeps the bound meaningful where the reference is
(nearly) exact, e.g. float32 outputs of a float32-accumulating reference.

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


@dataclass(frozen=True)
class Rule:
    """``k`` and ``atol_floor`` of the tolerance rule (see the module docstring)."""

    k: float
    atol_floor: float


@dataclass(frozen=True)
class Comparison:
    """One output (or gradient) judged by the rule; errors are absolute, ``scale`` = max |oracle|."""

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

    @property
    def baseline_worse(self) -> bool:
        """The reference is clearly further from the oracle than the op: the baseline is the weak one."""
        if self.problem or self.op_nonfinite:
            return False
        return self.ref_err > self.atol_floor and self.ref_err > BASELINE_MARGIN * self.op_err

    def _rel(self, err: float) -> float:
        return err / self.scale if self.scale > 0 else err

    def summary(self) -> str:
        if self.problem:
            return f"{self.label}: {self.problem}"
        if self.op_nonfinite:
            return f"{self.label}: {self.op_nonfinite} non-finite value(s) where the oracle is finite"
        verb = "<=" if self.passed else ">"
        return (
            f"{self.label}: err {self.op_err:.3g} (rel {self._rel(self.op_err):.2g}) {verb} allowed "
            f"{self.allowed:.3g} (reference err {self.ref_err:.3g})"
        )

    def details(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "passed": self.passed,
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


def _max_abs_err(a: torch.Tensor, oracle: torch.Tensor, where: torch.Tensor) -> tuple[float, int]:
    """(max |a - oracle| over ``where``, flat index of the max); (0, -1) if nothing to compare."""
    if not bool(where.any()):
        return 0.0, -1
    diff = torch.where(where, (a - oracle).abs(), torch.zeros((), dtype=a.dtype, device=a.device))
    flat = int(diff.reshape(-1).argmax())
    return float(diff.reshape(-1)[flat]), flat


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    index = []
    for size in reversed(shape):
        index.append(flat % size)
        flat //= size
    return tuple(reversed(index))


def compare_tensor(op: Any, ref: Any, oracle: Any, rule: Rule, label: str = "output") -> Comparison:
    """Judge one tensor of the op against the reference and the oracle."""
    if not isinstance(oracle, torch.Tensor):
        same = op == oracle
        return Comparison(
            label, bool(same), 0.0, 0.0, 0.0, 0.0, problem="" if same else f"{op!r} != {oracle!r}"
        )
    if not isinstance(op, torch.Tensor):
        return Comparison(
            label, False, 0.0, 0.0, 0.0, 0.0, problem=f"op returned {type(op).__name__}, not a tensor"
        )
    if tuple(op.shape) != tuple(oracle.shape):
        return Comparison(
            label,
            False,
            0.0,
            0.0,
            0.0,
            0.0,
            problem=f"shape {tuple(op.shape)} != expected {tuple(oracle.shape)}",
        )
    if isinstance(ref, torch.Tensor) and op.dtype != ref.dtype:
        return Comparison(
            label, False, 0.0, 0.0, 0.0, 0.0, problem=f"dtype {op.dtype} != reference {ref.dtype}"
        )
    o64 = oracle.detach().to(torch.float64)
    a64 = op.detach().to(device=o64.device, dtype=torch.float64)
    r64 = ref.detach().to(device=o64.device, dtype=torch.float64) if isinstance(ref, torch.Tensor) else o64
    finite = torch.isfinite(o64)
    op_bad = finite & ~torch.isfinite(a64)
    ref_bad = finite & ~torch.isfinite(r64)
    op_err, op_at = _max_abs_err(a64, o64, finite & ~op_bad)
    ref_err, _ = _max_abs_err(r64, o64, finite & ~ref_bad)
    scale = float(o64[finite].abs().max()) if bool(finite.any()) else 0.0
    allowed = rule.k * max(ref_err, rule.atol_floor)
    n_op_bad = int(op_bad.sum())
    if n_op_bad:
        op_at = int(op_bad.reshape(-1).nonzero()[0])
    worst = None
    if op_at >= 0:
        at = (op_at,)
        worst = (float(a64.reshape(-1)[at]), float(r64.reshape(-1)[at]), float(o64.reshape(-1)[at]))
    return Comparison(
        label=label,
        passed=n_op_bad == 0 and op_err <= allowed,
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
    )


def compare(
    op_out: Any, ref_out: Any, oracle_out: Any, rule: Rule, label: str = "output"
) -> list[Comparison]:
    """Judge every tensor leaf of an op's output (tensors, tuples, lists, dicts) by the rule."""
    op_leaves, op_spec = pytree.tree_flatten(op_out)
    ref_leaves, _ = pytree.tree_flatten(ref_out)
    oracle_leaves, oracle_spec = pytree.tree_flatten(oracle_out)
    if op_spec != oracle_spec or len(ref_leaves) != len(oracle_leaves):
        problem = f"output structure {op_spec} != reference structure {oracle_spec}"
        return [Comparison(label, False, 0.0, 0.0, 0.0, 0.0, problem=problem)]
    multi = len(oracle_leaves) > 1
    return [
        compare_tensor(o, r, g, rule, f"{label}[{i}]" if multi else label)
        for i, (o, r, g) in enumerate(zip(op_leaves, ref_leaves, oracle_leaves, strict=True))
    ]
