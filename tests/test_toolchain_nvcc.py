"""nvcc discovery per CUDA version, and installing toolkits from PyPI wheels into opgate's cache."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from opgate.validators.toolchain import (
    ToolchainUnavailable,
    cuobjdump_path,
    ensure_nvcc,
    find_nvcc,
    find_toolchain,
    nvcc_release,
)


@pytest.mark.integration
def test_machine_nvcc_13_0_is_found_with_its_real_toolkit_root() -> None:
    nvcc = find_nvcc("13.0")
    assert nvcc is not None
    assert nvcc_release(nvcc) is not None
    assert nvcc_release(nvcc).startswith("13.0.")  # type: ignore[union-attr]
    tc = find_toolchain("13.0")
    assert tc is not None
    # /usr/local/bin/nvcc is a wrapper script: the root must hold the CUDA headers, not /usr/local
    assert (tc.cuda_home / "include" / "cuda_runtime.h").is_file()


@pytest.mark.integration
def test_version_absent_from_machine_is_none_without_installing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPGATE_TOOLCHAINS", str(tmp_path))
    assert find_nvcc("11.1") is None
    assert list(tmp_path.iterdir()) == []


def test_bad_version_string_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"13\.0"):
        find_nvcc("13")


@pytest.mark.integration
def test_env_override_must_match_the_version(monkeypatch: pytest.MonkeyPatch) -> None:
    machine = find_nvcc("13.0")
    assert machine is not None
    monkeypatch.setenv("OPGATE_NVCC_12_9", str(machine))  # a 13.0 nvcc posing as 12.9 is refused
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setenv("OPGATE_TOOLCHAINS", "/nonexistent")
    assert find_nvcc("12.9") is None


@pytest.mark.integration
def test_cuda_12_9_wheel_has_no_nvcc_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """nvidia-cuda-nvcc-cu12 ships ptxas and libnvvm only: a clear reason, remembered in the cache."""
    monkeypatch.setenv("OPGATE_TOOLCHAINS", str(tmp_path))
    with pytest.raises(ToolchainUnavailable, match=re.escape("no nvcc driver (bin/ holds only: ptxas)")):
        ensure_nvcc("12.9")
    marker = tmp_path / "cuda-12.9" / "toolchain.json"
    assert marker.is_file()
    assert not (tmp_path / "cuda-12.9" / "site").exists()  # the 100 MB of wheels are not kept
    with pytest.raises(ToolchainUnavailable, match="no nvcc driver"):
        ensure_nvcc("12.9")  # answered from the marker, no second download


@pytest.mark.slow
def test_cuda_13_2_installs_from_pypi_and_compiles(tmp_path: Path) -> None:
    """A second real nvcc for the CUDA axis (default cache: installed once per machine, ~120 MB)."""
    tc = ensure_nvcc("13.2")
    assert tc.release.startswith("13.2.")
    assert (tc.cuda_home / "lib64" / "libcudart.so").exists()
    src = Path(__file__).parent / "data" / "build" / "probe.cu"
    out = tmp_path / "probe.o"
    subprocess.run(
        [str(tc.nvcc), "-c", str(src), "-o", str(out), "-gencode=arch=compute_90,code=sm_90"],
        check=True,
        capture_output=True,
    )
    assert out.stat().st_size > 0


@pytest.mark.integration
def test_cuobjdump_is_found_and_runs() -> None:
    tool = cuobjdump_path()
    out = subprocess.run([str(tool), "--version"], capture_output=True, text=True, check=False)
    assert "cuobjdump" in out.stdout
    assert shutil.which(str(tool)) is not None
