"""sass: a CUDA C++ binary without machine code for the running GPU is reported, never silent."""

from __future__ import annotations

from opgate.validators.checks.sass import judge
from opgate.validators.result import Verdict


def _report(missing: list[str], jit: bool) -> dict[str, object]:
    return {"device_arch": "sm_90", "capability": "9.0", "kernels_without_sass": missing,
            "jit_from_ptx": jit, "native": not missing}  # fmt: skip


def test_native_binary_passes() -> None:
    result = judge(_report([], jit=False))
    assert result.status is Verdict.PASS
    assert "sm_90" in result.summary


def test_ptx_only_kernel_is_a_fallback_naming_it() -> None:
    result = judge(_report(["rms_norm_fwd_kernel"], jit=True))
    assert result.status is Verdict.FALLBACK
    assert "JIT from PTX: rms_norm_fwd_kernel" in result.summary


def test_kernel_with_neither_sass_nor_ptx_fails() -> None:
    result = judge(_report(["silu_mul_fwd_kernel"], jit=False))
    assert result.status is Verdict.FAIL
    assert "no usable PTX" in result.summary
