"""opgate's CUDA C++ ops built with cpp_extension: arch coverage, registration, and the build cache.

Needs a CUDA build of torch (the torch 2.14.1 nox session, or the GPU machine);
a CPU-only torch cannot compile CUDA extensions at all, which the build check
reports as ``skip`` (tested in test_build_check.py).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from opgate.validators import cuda_build as cb
from opgate.validators.binaries import kernels_by_arch, list_arches
from opgate.validators.toolchain import ensure_nvcc

pytestmark = pytest.mark.skipif(torch.version.cuda is None, reason="needs a CUDA build of torch")
OPS = Path(__file__).resolve().parent.parent / "ops"


@pytest.mark.slow
@pytest.mark.parametrize("op", ["rms_norm", "silu_mul"])
def test_extension_holds_both_arches_and_second_build_is_a_cache_hit(op: str, tmp_path: Path) -> None:
    sources = [OPS / op / "cuda" / f"{op}_op.cpp", OPS / op / "cuda" / f"{op}_kernels.cu"]
    tc = ensure_nvcc("13.0")
    first = cb.build(f"opgate_{op}_cuda", sources, ["sm_80", "sm_90"], False, tc, root=tmp_path)
    assert not first.cache_hit
    found = list_arches(first.library)
    assert found.sass == ("sm_80", "sm_90")
    assert all(any(f"{op}_fwd" in k for k in ks) for ks in kernels_by_arch(first.library).values())
    start = time.monotonic()
    second = cb.build(f"opgate_{op}_cuda", sources, ["sm_80", "sm_90"], False, tc, root=tmp_path)
    assert second.cache_hit
    assert second.library == first.library
    assert time.monotonic() - start < 2.0


def test_planted_policy_change_is_a_new_build_missing_the_arch(tmp_path: Path) -> None:
    """Built for sm_80 only: a policy claiming sm_90 must not find sm_90 in it."""
    op = "silu_mul"
    sources = [OPS / op / "cuda" / f"{op}_op.cpp", OPS / op / "cuda" / f"{op}_kernels.cu"]
    built = cb.build("opgate_planted_sm80", sources, ["sm_80"], False, ensure_nvcc("13.0"), root=tmp_path)
    assert list_arches(built.library).sass == ("sm_80",)


def test_major_mismatch_is_refused_before_compiling(monkeypatch: pytest.MonkeyPatch) -> None:
    tc = ensure_nvcc("13.0")
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    with pytest.raises(cb.CudaBuildUnsupported, match="CUDA major version"):
        cb.build("opgate_never", [OPS / "silu_mul" / "cuda" / "silu_mul_op.cpp"], ["sm_90"], False, tc)


def test_arch_list_syntax() -> None:
    assert cb.arch_list(["sm_80", "sm_90"], False) == "8.0;9.0"
    assert cb.arch_list(["sm_80", "sm_90"], True) == "8.0;9.0+PTX"
    with pytest.raises(ValueError, match="sm_XY"):
        cb.arch_list(["ampere"], False)
