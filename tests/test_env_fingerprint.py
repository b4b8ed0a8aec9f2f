"""The environment fingerprint and its column key."""

from __future__ import annotations

import shutil

import pytest

from validators import env

H200_FP = {
    "torch": "2.11.0+cu130",
    "triton": "3.6.0",
    "python": "3.12.3",
    "gpu_name": "NVIDIA H200",
    "gpu_capability": "9.0",
}


def test_env_key_for_a_cpu_machine() -> None:
    fp = {"torch": "2.13.0+cpu", "triton": "3.8.0", "python": "3.11.7", "gpu_name": None}
    assert env.env_key(fp) == "pt2.13.0-cpu-triton3.8.0-py3.11"


def test_env_key_for_a_gpu_machine_keeps_the_cuda_build() -> None:
    assert env.env_key(H200_FP) == "pt2.11.0+cu130-H200-sm_90-triton3.6.0-py3.12"


def test_env_key_separates_what_must_stay_apart() -> None:
    base = env.env_key(H200_FP)
    variants = [
        {**H200_FP, "torch": "2.11.0+cu126"},
        {**H200_FP, "gpu_name": "NVIDIA A100-SXM4-80GB", "gpu_capability": "8.0"},
        {**H200_FP, "python": "3.11.2"},
        {**H200_FP, "triton": "3.5.0"},
        {**H200_FP, "gpu_name": None, "gpu_capability": None},
    ]
    keys = {env.env_key(v) for v in variants}
    assert base not in keys
    assert len(keys) == len(variants)
    # ...and ignores what must not split a column (patch of python, host, driver)
    assert env.env_key({**H200_FP, "python": "3.12.9", "hostname_hash": "x", "driver": "580.1"}) == base


def test_short_gpu_names() -> None:
    assert env.short_gpu_name("NVIDIA H200") == "H200"
    assert env.short_gpu_name("NVIDIA A100-SXM4-80GB") == "A100-SXM4-80GB"
    assert env.short_gpu_name("Tesla V100 PCIe") == "V100_PCIe"


def test_fingerprint_of_this_interpreter() -> None:
    import torch

    fp = env.fingerprint()
    assert fp["torch"] == torch.__version__
    assert fp["python"].count(".") == 2
    assert fp["env_key"] == env.env_key(fp)
    assert len(fp["hostname_hash"]) == 12
    if not torch.cuda.is_available():
        assert (fp["gpus"], fp["gpu_name"], fp["gpu_capability"], fp["driver"]) == ([], None, None, None)
        assert "-cpu-" in fp["env_key"]
    for key in ("triton", "cuda_runtime", "nvcc", "cxx11abi", "platform"):
        assert key in fp


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc on PATH")
def test_nvcc_version_is_read_from_the_binary() -> None:
    nvcc = shutil.which("nvcc")
    assert nvcc is not None
    version = env.nvcc_version(nvcc)
    assert version is not None
    assert version.count(".") == 1
    assert env.fingerprint()["nvcc"] == {version: nvcc}


def test_nvcc_version_of_something_else_is_none() -> None:
    assert env.nvcc_version("/bin/true") is None
    assert env.nvcc_version("/no/such/nvcc") is None
