# ruff: noqa: E501  (embedded child-process source and signature tables)
"""The mode-"build" check: Triton cross-compiles, CUDA C++ arch coverage, and the verdicts it gives."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from opgate.matrix.cell import Cell
from opgate.matrix.spec import OpSpec, load_spec
from opgate.validators.binaries import kernels_by_arch, list_arches
from opgate.validators.checks.build import _judge_cuda, run_build_cell
from opgate.validators.result import Verdict
from opgate.validators.toolchain import find_nvcc

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data" / "build"


@pytest.fixture(scope="module")
def probe_spec() -> OpSpec:
    return load_spec(DATA / "probe_op" / "spec.yaml", REPO)


def _cell(impl: str, arch: str, cuda: str = "13.0") -> Cell:
    return Cell("probe", impl, torch.__version__, cuda, arch, "all", "all", "build")


@pytest.mark.integration
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_triton_cross_compile_holds_sass_for_the_cell_arch(
    probe_spec: OpSpec, arch: str, tmp_path: Path
) -> None:
    out = run_build_cell(_cell("triton", arch), probe_spec, tmp_path)
    check = out.checks[0]
    assert check.status is Verdict.PASS, check.summary
    kernels = check.details["kernels"]
    assert [(k["kernel"], k["dtype"]) for k in kernels] == [
        ("_probe_scale_kernel", "fp32"),
        ("_probe_scale_kernel", "bf16"),
    ]
    for k in kernels:
        assert k["sass"][0].startswith(arch)  # sm_90 compiles to sm_90a: runs on 9.0 only
        assert k["compile_s"] < 5.0


@pytest.mark.integration
def test_real_rms_norm_kernel_cross_compiles(tmp_path: Path) -> None:
    """opgate's own Triton RMSNorm forward kernel, for sm_80 and sm_90, with no GPU."""
    code = f"""
import json, sys
from pathlib import Path
from opgate.validators.checks import triton_build as tb
found, _ = tb.discover("opgate.ops.rms_norm.triton_impl")
sig = {{"signature": {{"x_ptr": "*{{dtype}}", "w_ptr": "*{{dtype}}", "y_ptr": "*{{dtype}}", "n_rows": "i32",
        "N": "i32", "R1": "i32", "R2": "i32", "xs0": "i64", "xs1": "i64", "xs2": "i64", "xsn": "i64",
        "wsn": "i64", "eps": "fp32"}},
       "constexprs": {{"NLEAD": 1, "BLOCK_M": 1, "BLOCK_N": 4096, "CHUNKED": False, "ACC": "fp32", "RNE": True}},
       "options": {{"num_warps": 8}}}}
rows = [tb.compile_kernel(found["_rms_norm_fwd_kernel"], sig, "bf16", a, Path("{tmp_path}")) for a in ("sm_80", "sm_90")]
print(json.dumps(rows))
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    for row, arch in zip(rows, ("sm_80", "sm_90a"), strict=True):
        assert "error" not in row, row
        assert list_arches(Path(row["cubin"])).sass == (arch,)
        assert row["compile_s"] < 5.0


def _with_impl(spec: OpSpec, name: str, **changes: Any) -> OpSpec:
    impl = dataclasses.replace(spec.implementations[name], **changes)
    return dataclasses.replace(spec, implementations={**spec.implementations, name: impl})


@pytest.mark.integration
def test_bad_triton_signature_fails_the_cell(probe_spec: OpSpec, tmp_path: Path) -> None:
    spec = _with_impl(probe_spec, "triton", module="tests.data.build.probe_op.triton_bad")
    check = run_build_cell(_cell("triton", "sm_80"), spec, tmp_path).checks[0]
    assert check.status is Verdict.FAIL
    assert "missing ['y_ptr', 'n', 'factor'], unknown ['bogus']" in check.details["kernels"][0]["error"]


@pytest.fixture(scope="module")
def sm80_only(tmp_path_factory: pytest.TempPathFactory) -> Path:
    nvcc = find_nvcc("13.0")
    assert nvcc is not None
    out = tmp_path_factory.mktemp("planted") / "sm80_only.o"
    subprocess.run(
        [str(nvcc), "-c", str(DATA / "probe.cu"), "-o", str(out), "-gencode=arch=compute_80,code=sm_80"],
        check=True,
        capture_output=True,
    )
    return out


@pytest.mark.integration
def test_planted_build_missing_an_arch_fails_with_the_listing(sm80_only: Path) -> None:
    found = list_arches(sm80_only)
    out = _judge_cuda(found, kernels_by_arch(sm80_only), ["sm_80", "sm_90"], False, (), {}, "13.0.88", 0.0)
    check = out.checks[0]
    assert check.status is Verdict.FAIL
    assert check.summary.startswith("binary lacks sm_90")
    assert "sm80_only.1.sm_80.cubin" in check.details["listing"]
    assert check.details["missing"] == ["sm_90"]


@pytest.mark.integration
def test_policy_asking_ptx_fails_without_ptx(sm80_only: Path) -> None:
    found = list_arches(sm80_only)
    out = _judge_cuda(found, kernels_by_arch(sm80_only), ["sm_80"], True, (), {}, "13.0.88", 0.0)
    assert out.checks[0].status is Verdict.FAIL
    assert out.checks[0].details["missing"] == ["compute_80"]


@pytest.mark.integration
def test_expected_kernel_absent_from_a_cubin_fails(sm80_only: Path) -> None:
    found, by_arch = list_arches(sm80_only), kernels_by_arch(sm80_only)
    ok = _judge_cuda(found, by_arch, ["sm_80"], False, ("*opgate_probe_kernel*",), {}, "13.0.88", 0.0)
    assert ok.checks[0].status is Verdict.PASS
    bad = _judge_cuda(found, by_arch, ["sm_80"], False, ("*rms_norm_fwd*",), {}, "13.0.88", 0.0)
    assert bad.checks[0].status is Verdict.FAIL
    assert bad.checks[0].details["kernels_missing_by_arch"] == {"sm_80": ["*rms_norm_fwd*"]}


def test_cuda_cell_verdicts_without_building(
    probe_spec: OpSpec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CPU-only torch -> skip; torch CUDA 13 with nvcc 12.9 -> unsupported; cpu arch -> skip."""
    monkeypatch.setattr(torch.version, "cuda", None)
    out = run_build_cell(_cell("cuda", "sm_90"), probe_spec, tmp_path)
    assert out.verdict is Verdict.SKIP
    assert "CPU-only" in out.reason
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    out = run_build_cell(_cell("cuda", "sm_90", cuda="12.9"), probe_spec, tmp_path)
    assert out.checks[0].status is Verdict.UNSUPPORTED
    assert "CUDA 13.0" in out.reason
    assert "12.9" in out.reason
    assert run_build_cell(_cell("cuda", "cpu"), probe_spec, tmp_path).verdict is Verdict.SKIP


def test_arch_outside_policy_is_unsupported(probe_spec: OpSpec, tmp_path: Path) -> None:
    spec = _with_impl(probe_spec, "triton", arch_policy={"sass": ["sm_90"], "ptx": False})
    out = run_build_cell(_cell("triton", "sm_80"), spec, tmp_path)
    assert out.checks[0].status is Verdict.UNSUPPORTED
