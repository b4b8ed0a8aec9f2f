"""Every Triton kernel of opgate's ops declares a complete build signature.

The build check (validators/checks/triton_build.py) cross-compiles each kernel for
sm_80/sm_90 from ``TRITON_BUILD_SIGNATURES``; a parameter missing there fails that
check on every arch, so it is caught here first, without compiling anything.
"""

from __future__ import annotations

import importlib
import inspect

import pytest

MODULES = {
    "opgate.ops.rms_norm.triton_kernels": 4,
    "opgate.ops.fused_add_rms_norm.triton_kernels": 2,
    "opgate.ops.silu_mul.triton_impl": 2,
    "opgate.ops.rope.triton_impl": 1,
    "opgate.ops.layer_norm.triton_kernels": 4,
}


@pytest.mark.parametrize("module", list(MODULES))
def test_signatures_bind_every_parameter(module: str) -> None:
    mod = importlib.import_module(module)
    sigs = mod.TRITON_BUILD_SIGNATURES
    assert len(sigs) == MODULES[module]
    for name, entry in sigs.items():
        fn = getattr(getattr(mod, name), "fn", None)
        assert fn is not None, f"{module}.{name} is not a Triton kernel"
        params = inspect.signature(fn).parameters
        constexpr = {p for p, v in params.items() if "constexpr" in str(v.annotation)}
        runtime = set(params) - constexpr
        assert set(entry["signature"]) == runtime, f"{name}: runtime args differ"
        assert set(entry["constexprs"]) == constexpr, f"{name}: constexprs differ"
        pointers = {p for p, t in entry["signature"].items() if t.startswith("*")}
        assert pointers == {p for p in runtime if p.endswith("_ptr")}
