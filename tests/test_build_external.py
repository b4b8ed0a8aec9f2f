"""Build and sass checks of external implementations: the arch audit of binaries built here with nvcc.

A fake installed distribution (a ``dist-info`` beside a package folder on
``sys.path``) holds shared libraries built in the test with planted arch
sets, so every verdict is produced by the same path a real wheel takes.
"""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from opgate.matrix.cell import Cell
from opgate.matrix.errors import ConfigError
from opgate.matrix.spec import Evidence, OpSpec, load_spec
from opgate.validators.binaries import gpu_sass_report, kernels_by_arch, parse_resource_usage
from opgate.validators.binsource import loaded_binaries
from opgate.validators.checks.build import run_build_cell
from opgate.validators.checks.sass import judge, judge_loaded
from opgate.validators.result import Verdict
from opgate.validators.toolchain import find_nvcc

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data" / "build"
DIST = "opgate-probe-wheel"
LIB_GLOB = "opgate_probe_wheel/libprobe_cuda{cuda_major}{cuda_minor}.so"


def _nvcc(*args: str) -> None:
    nvcc = find_nvcc("13.0")
    assert nvcc is not None, "the machine's nvcc 13.0 is required"
    subprocess.run([str(nvcc), *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """site-packages with opgate-probe-wheel 1.0: cuda130 = sm_80 SASS only, cuda132 = compute_90 PTX only,
    cuda131 = sm_80 + sm_90 SASS."""
    root = tmp_path_factory.mktemp("site")
    pkg = root / "opgate_probe_wheel"
    pkg.mkdir()
    info = root / "opgate_probe_wheel-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {DIST}\nVersion: 1.0\n")
    gencodes = {
        "130": ["arch=compute_80,code=sm_80"],
        "132": ["arch=compute_90,code=compute_90"],
        "131": ["arch=compute_80,code=sm_80", "arch=compute_90,code=sm_90"],
    }
    for tag, codes in gencodes.items():
        out = pkg / f"libprobe_cuda{tag}.so"
        flags = [f"-gencode={g}" for g in codes]
        _nvcc("-shared", "-Xcompiler", "-fPIC", str(DATA / "probe.cu"), "-o", str(out), *flags)
    (info / "RECORD").write_text("".join(f"opgate_probe_wheel/{p.name},,\n" for p in pkg.iterdir()))
    return root


@pytest.fixture
def spec(site: Path, monkeypatch: pytest.MonkeyPatch) -> OpSpec:
    monkeypatch.syspath_prepend(str(site))
    probe = load_spec(DATA / "probe_op" / "spec.yaml", REPO)
    impl = dataclasses.replace(
        probe.implementations["cuda"],
        name="ext",
        kind="external",
        binaries={"files": [LIB_GLOB], "distribution": DIST},
    )
    return dataclasses.replace(probe, implementations={"ext": impl})


def _with(spec: OpSpec, **changes: Any) -> OpSpec:
    impl = dataclasses.replace(spec.implementations["ext"], **changes)
    return dataclasses.replace(spec, implementations={"ext": impl})


def _build(spec: OpSpec, arch: str, cuda: str, tmp: Path) -> tuple[Verdict, str]:
    cell = Cell("probe", "ext", torch.__version__, cuda, arch, "all", "all", "build")
    check = run_build_cell(cell, spec, tmp).checks[0]
    return check.status, check.summary


@pytest.mark.integration
def test_planted_missing_arch_fails_only_its_column(spec: OpSpec, tmp_path: Path) -> None:
    assert _build(spec, "sm_80", "13.0", tmp_path)[0] is Verdict.PASS
    status, summary = _build(spec, "sm_90", "13.0", tmp_path)
    assert status is Verdict.FAIL
    assert summary.startswith("libprobe_cuda130.so: binary lacks sm_90 (SASS sm_80; PTX none)")


@pytest.mark.integration
def test_ptx_only_library_fails_the_build_and_is_a_jit_fallback_on_the_gpu(
    spec: OpSpec, site: Path, tmp_path: Path
) -> None:
    status, summary = _build(spec, "sm_90", "13.2", tmp_path)
    assert status is Verdict.FAIL
    assert "binary lacks sm_90 (SASS none; PTX compute_90)" in summary
    report = gpu_sass_report(site / "opgate_probe_wheel" / "libprobe_cuda132.so", (9, 0))
    assert report["jit_from_ptx"] is True
    assert judge(report).status is Verdict.FALLBACK


@pytest.mark.integration
def test_correct_library_passes_both_arches_and_checks_expected_kernels(spec: OpSpec, tmp_path: Path) -> None:
    for arch in ("sm_80", "sm_90"):
        assert _build(spec, arch, "13.1", tmp_path) == (
            Verdict.PASS,
            "libprobe_cuda131.so: SASS sm_80, sm_90; PTX none; 1 kernels in " + arch,
        )
    # demangled names match too: the profiler shows "opgate_probe_kernel(float*, int)"
    named = _with(spec, evidence={"cuda": Evidence(expect=("opgate_probe_kernel(float*, int)",))})
    assert _build(named, "sm_90", "13.1", tmp_path)[0] is Verdict.PASS
    absent = _with(spec, evidence={"cuda": Evidence(expect=("*rms_norm*",))})
    status, summary = _build(absent, "sm_90", "13.1", tmp_path)
    assert status is Verdict.FAIL
    assert "expected kernels absent from cubins: sm_90: *rms_norm*" in summary
    ptx_policy = _with(spec, arch_policy={"sass": ["sm_80", "sm_90"], "ptx": True})
    assert "binary lacks compute_80" in _build(ptx_policy, "sm_80", "13.1", tmp_path)[1]


@pytest.mark.integration
def test_missing_file_and_missing_distribution(spec: OpSpec, tmp_path: Path) -> None:
    status, summary = _build(spec, "sm_90", "12.8", tmp_path)
    assert status is Verdict.FAIL
    assert summary == f"{DIST} 1.0 ships no file matching opgate_probe_wheel/libprobe_cuda128.so"
    gone = _with(spec, binaries={"files": [LIB_GLOB], "distribution": "opgate-not-installed"})
    assert _build(gone, "sm_90", "13.0", tmp_path) == (
        Verdict.SKIP,
        "distribution 'opgate-not-installed' is not installed here",
    )


@pytest.mark.integration
def test_helper_functions_are_not_kernels(tmp_path: Path) -> None:
    """Relocatable device code keeps the device function and __cuda_sm70_shflsync_down_p out of line."""
    obj = tmp_path / "helper.o"
    _nvcc("-rdc=true", "-c", str(DATA / "helper.cu"), "-o", str(obj), "-gencode=arch=compute_80,code=sm_80")
    assert kernels_by_arch(obj) == {"sm_80": ["_Z24opgate_probe_shfl_kernelPfi"]}
    report = gpu_sass_report(obj, (9, 0))
    assert report["kernels_without_sass"] == ["_Z24opgate_probe_shfl_kernelPfi"]


def test_resource_usage_parser_reads_elf_sections_only() -> None:
    text = (
        "Fatbin elf code:\n================\narch = sm_90\n\nResource usage:\n Common:\n  GLOBAL:0\n"
        " Function __cuda_sm70_warpsync:\n  REG:24 STACK:0 SHARED:0\n"
        " Function _Z1kPf:\n  REG:8 CONSTANT[0]:360\n"
        "\nFatbin ptx code:\n================\narch = sm_120\n"
        "\nFatbin elf code:\n================\narch = sm_90\n"
        " Function _Z1kPf:\n  REG:8 CONSTANT[0]:360\n Function _Z1gPf:\n  REG:8 CONSTANT[0]:360\n"
    )
    assert parse_resource_usage(text) == {"sm_90": ["_Z1kPf", "_Z1gPf"]}


@pytest.mark.integration
def test_gpu_cells_record_the_mapped_binary(spec: OpSpec, site: Path, tmp_path: Path) -> None:
    lib = site / "opgate_probe_wheel" / "libprobe_cuda130.so"
    maps = tmp_path / "maps"
    maps.write_text(
        f"7f00-7f10 r-xp 00000000 08:01 1 {lib}\n7f10-7f20 r--p 00000000 08:01 2 /usr/lib/libc.so.6\n"
    )
    impl = spec.implementations["ext"]
    assert loaded_binaries(impl.binaries, impl.module, maps) == [lib.resolve()]
    loaded = judge_loaded([gpu_sass_report(lib, (9, 0))], LIB_GLOB)
    assert loaded.status is Verdict.FAIL  # sm_80 SASS only, no PTX: cannot run on sm_90
    assert loaded.summary.startswith("loaded libprobe_cuda130.so: no sm_90 SASS and no usable PTX")
    assert judge_loaded([], LIB_GLOB).status is Verdict.FALLBACK


@pytest.mark.integration
def test_launched_triton_kernels_cross_compile(tmp_path: Path) -> None:
    """A library written in Triton: the kernels its op launches are recorded, then built per arch."""
    probe = load_spec(DATA / "probe_op" / "spec.yaml", REPO)
    impl = dataclasses.replace(
        probe.implementations["triton"],
        name="ext",
        kind="external",
        module="tests.data.build.probe_op.launcher",
        entry="tests.data.build.probe_op.launcher:probe",
        binaries={"triton": True},
    )
    spec = dataclasses.replace(
        probe, samples="tests.data.build.probe_op.launcher:sample_inputs", implementations={"ext": impl}
    )
    cell = Cell("probe", "ext", torch.__version__, "13.0", "sm_80", "all", "all", "build")
    check = run_build_cell(cell, spec, tmp_path).checks[0]
    assert check.status is Verdict.PASS, check.summary
    assert [(k["kernel"], k["dtype"], k["sass"]) for k in check.details["kernels"]] == [
        ("_probe_scale_kernel", "fp32", ["sm_80"]),
        ("_probe_scale_kernel", "bf16", ["sm_80"]),
    ]


def _spec_text(impl: str) -> str:
    return (
        "spec_version: 1\nop: probe\nsummary: s\ncategory: other\nreference: a.b:c\nsamples: a.b:d\n"
        "shapes: {default: [[8]]}\ndtypes: [fp32]\nlayouts: [contiguous]\nmodes: [eager, build]\n"
        f"tolerance: {{k: 2.0, atol_floor: 0.0}}\nimplementations:\n  ext:\n{impl}"
    )


def test_spec_rules_for_binaries(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    (tmp_path / "a").mkdir()  # the references must resolve: a/b.py defines c and d
    (tmp_path / "a" / "__init__.py").write_text("")
    (tmp_path / "a" / "b.py").write_text("def c(x): ...\n\n\ndef d(*args): ...\n")
    ev = "    evidence: {cuda: {expect: [k]}}\n"
    path.write_text(_spec_text("    kind: external\n    entry: a.b:c\n    modes: [eager, build]\n" + ev))
    with pytest.raises(ConfigError, match="build of an external implementation needs binaries"):
        load_spec(path, tmp_path)
    external = "    kind: external\n    entry: a.b:c\n"
    path.write_text(_spec_text(external + "    binaries: {files: [x/*.so]}\n" + ev))
    with pytest.raises(ConfigError, match="files need a distribution"):
        load_spec(path, tmp_path)
    path.write_text(_spec_text(external + "    requires: [pkg]\n    binaries: {files: [x/*.so]}\n" + ev))
    assert load_spec(path, tmp_path).implementations["ext"].binaries["distribution"] == "pkg"
    path.write_text(
        _spec_text(
            "    kind: triton\n    entry: a.b:c\n    module: a.b\n    qualname: x::y\n"
            "    binaries: {loaded: true}\n" + ev
        )
    )
    with pytest.raises(ConfigError, match="only kind external names its binaries"):
        load_spec(path, tmp_path)
