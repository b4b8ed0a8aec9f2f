"""Planted Triton module for the build-check tests: one kernel, one helper, and its build signature."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _probe_scale(x, factor):  # type: ignore[no-untyped-def]
    return x * factor


@triton.jit
def _probe_scale_kernel(x_ptr, y_ptr, n, factor, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    tl.store(y_ptr + offs, _probe_scale(x, factor).to(y_ptr.dtype.element_ty), mask=mask)


TRITON_BUILD_SIGNATURES = {
    "_probe_scale_kernel": {
        "signature": {"x_ptr": "*{dtype}", "y_ptr": "*{dtype}", "n": "i32", "factor": "fp32"},
        "constexprs": {"BLOCK": 1024},
        "options": {"num_warps": 4},
    },
}
