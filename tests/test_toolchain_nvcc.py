"""nvcc discovery per CUDA version, and installing toolkits from PyPI wheels into opgate's cache."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from opgate.validators.toolchain import (
    PROBES_FILE,
    ToolchainUnavailable,
    cuobjdump_path,
    ensure_nvcc,
    find_nvcc,
    find_toolchain,
    nvcc_cuda_home,
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
    assert [p.name for p in tmp_path.iterdir() if p.name != PROBES_FILE] == []  # no toolkit installed


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


def _fake_nvcc(path: Path, release: str, calls: Path) -> None:
    """An nvcc that answers ``--version`` and ``--dryrun`` as nvcc does, and logs each call."""
    path.write_text(
        "#!/bin/sh\n"
        f'echo "$1" >> {calls}\n'
        f'if [ "$1" = --version ]; then echo "Cuda compilation tools, release {release[:4]}, '
        f'V{release}"; fi\n'
        f'if [ "$1" = --dryrun ]; then echo "#$ _HERE_={path.parent}/real/bin" >&2; fi\n'
    )
    path.chmod(0o755)


@pytest.mark.integration
def test_what_an_nvcc_said_is_remembered_until_the_file_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each run plans by nvcc's release and root: asked once per nvcc file, again once it changed."""
    monkeypatch.setenv("OPGATE_TOOLCHAINS", str(tmp_path / "cache"))
    nvcc, calls = tmp_path / "bin" / "nvcc", tmp_path / "calls"
    nvcc.parent.mkdir()
    _fake_nvcc(nvcc, "12.4.131", calls)
    for _ in range(3):
        assert nvcc_release(nvcc) == "12.4.131"
        assert nvcc_cuda_home(nvcc) == tmp_path / "bin" / "real"
    assert calls.read_text().split() == ["--version", "--dryrun"]  # once each, then remembered
    _fake_nvcc(nvcc, "12.6.85", calls)  # another toolkit installed in its place
    assert nvcc_release(nvcc) == "12.6.85"
    assert calls.read_text().split() == ["--version", "--dryrun", "--version"]
    nvcc.write_text("#!/bin/sh\nexit 1\n")  # an nvcc that does not run: asked every time, never kept
    for _ in range(2):
        assert nvcc_release(nvcc) is None
    (tmp_path / "cache" / PROBES_FILE).write_text("{not json")  # a torn cache costs the probe, nothing else
    _fake_nvcc(nvcc, "12.4.131", calls)
    assert nvcc_release(nvcc) == "12.4.131"
