"""Planted Triton module whose build signature does not match the kernel (the build check must fail)."""

from __future__ import annotations

from tests.data.build.probe_op.triton_kernels import _probe_scale_kernel

__all__ = ["_probe_scale_kernel"]

TRITON_BUILD_SIGNATURES = {
    "_probe_scale_kernel": {"signature": {"x_ptr": "*{dtype}", "bogus": "i32"}, "constexprs": {"BLOCK": 64}},
}
