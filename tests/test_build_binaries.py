"""cuobjdump parsing on real binaries built in the test: which SASS and PTX a file holds."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from opgate.validators.binaries import (
    BinaryInspectionError,
    arch_of,
    gpu_sass_report,
    kernels_by_arch,
    list_arches,
    missing_arches,
    parse_listing,
    sass_runs_on,
)
from opgate.validators.toolchain import find_nvcc

PROBE = Path(__file__).parent / "data" / "build" / "probe.cu"


def _build(tmp: Path, name: str, *gencode: str) -> Path:
    nvcc = find_nvcc("13.0")
    assert nvcc is not None, "the machine's nvcc 13.0 is required"
    out = tmp / f"{name}.o"
    cmd = [str(nvcc), "-c", str(PROBE), "-o", str(out), *(f"-gencode={g}" for g in gencode)]
    subprocess.run(cmd, check=True, capture_output=True)
    return out


@pytest.fixture(scope="module")
def binaries(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("bin")
    return {
        "sm80": _build(tmp, "sm80", "arch=compute_80,code=sm_80"),
        "sm80_90_ptx": _build(
            tmp, "both", "arch=compute_80,code=sm_80", "arch=compute_90,code=[sm_90,compute_90]"
        ),
    }


@pytest.mark.integration
def test_sm80_only_build_lists_only_sm80(binaries: dict[str, Path]) -> None:
    found = list_arches(binaries["sm80"])
    assert found.sass == ("sm_80",)
    assert found.ptx == ()
    assert "sm_80.cubin" in found.listing
    assert missing_arches(found, ["sm_80", "sm_90"]) == ["sm_90"]


@pytest.mark.integration
def test_two_arch_build_with_ptx(binaries: dict[str, Path]) -> None:
    found = list_arches(binaries["sm80_90_ptx"])
    assert found.sass == ("sm_80", "sm_90")
    assert found.ptx == ("compute_90",)
    assert missing_arches(found, ["sm_80", "sm_90"], ["compute_90"]) == []
    assert missing_arches(found, ["sm_80"], ["compute_80"]) == ["compute_80"]


@pytest.mark.integration
def test_kernel_names_per_arch(binaries: dict[str, Path]) -> None:
    by_arch = kernels_by_arch(binaries["sm80_90_ptx"])
    assert set(by_arch) == {"sm_80", "sm_90"}
    assert all(any("opgate_probe_kernel" in k for k in ks) for ks in by_arch.values())


@pytest.mark.integration
def test_gpu_report_flags_kernels_that_would_jit(binaries: dict[str, Path]) -> None:
    only80 = gpu_sass_report(binaries["sm80"], (9, 0))
    assert only80["native"] is False
    assert only80["jit_from_ptx"] is False  # no PTX either: it cannot run at all on sm_90
    assert only80["kernels_without_sass"]
    with_ptx = gpu_sass_report(binaries["sm80_90_ptx"], (10, 0))
    assert with_ptx["jit_from_ptx"] is True
    assert gpu_sass_report(binaries["sm80_90_ptx"], (9, 0))["native"] is True
    assert gpu_sass_report(binaries["sm80"], (8, 6))["native"] is True  # sm_80 SASS runs on sm_86


@pytest.mark.integration
def test_host_only_file_has_no_device_code() -> None:
    found = list_arches(Path("/bin/ls"))
    assert not found.has_device_code
    assert found.sass == ()


@pytest.mark.integration
def test_unreadable_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(BinaryInspectionError, match="Could not open"):
        list_arches(tmp_path / "missing.so")


def test_listing_parser_and_arch_names() -> None:
    text = (
        "ELF file    1: ext.1.sm_80.cubin\nELF file    2: ext.2.sm_90a.cubin\n"
        "PTX file    1: ext.1.sm_90.ptx\n"
    )
    assert parse_listing(text) == (["ext.1.sm_80.cubin", "ext.2.sm_90a.cubin"], ["ext.1.sm_90.ptx"])
    assert arch_of("k.sm_90a.cubin") == "sm_90a"
    assert arch_of("no arch here") is None
    assert sass_runs_on("sm_90a", (9, 0))
    assert not sass_runs_on("sm_90a", (9, 1))
    assert not sass_runs_on("sm_80", (9, 0))
