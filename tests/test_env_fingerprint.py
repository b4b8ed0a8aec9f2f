"""The environment fingerprint and its column key."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from opgate.validators import env
from opgate.validators.device import Gpu
from opgate.validators.workerproc import WorkerConfig

H200_FP: dict[str, Any] = {
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


@pytest.mark.integration
def test_fingerprint_of_this_interpreter() -> None:
    import torch

    record = env.fingerprint().to_json()
    assert record["torch"] == torch.__version__
    assert record["python"].count(".") == 2
    assert record["env_key"] == env.env_key(record)
    assert len(record["hostname_hash"]) == 12
    if not torch.cuda.is_available():
        assert (record["gpus"], record["gpu_name"], record["gpu_capability"], record["driver"]) == (
            [],
            None,
            None,
            None,
        )
        assert "-cpu-" in record["env_key"]
    for key in ("triton", "cuda_runtime", "nvcc", "cxx11abi", "platform"):
        assert key in record
    assert env.Fingerprint.from_json(record).to_json() == record, "the record reads back as written"


@pytest.mark.integration
def test_the_probe_subprocess_writes_the_same_record() -> None:
    """``python -m opgate.validators.env`` (the parent's probe) speaks the workers' format."""
    record = env.probe()
    assert env.Fingerprint.from_json(record).key == record["env_key"]
    assert set(record) == set(env.fingerprint().to_json())


def test_a_field_the_writer_never_writes_is_an_error_not_a_guess() -> None:
    with pytest.raises(env.FingerprintError, match=r"unknown fingerprint field.*'cuda'"):
        env.Fingerprint.from_json({**H200_FP, "cuda": "13.0"})
    with pytest.raises(env.FingerprintError, match="JSON object"):
        env.Fingerprint.from_json(["torch"])  # type: ignore[arg-type]


def test_a_failed_probe_is_keyed_unknown() -> None:
    record = env.Fingerprint(error="environment probe failed: boom").to_json()
    assert record["env_key"] == "unknown"
    assert env.Fingerprint.from_json(record).error == "environment probe failed: boom"


def test_accessors_readers_use() -> None:
    fp = env.Fingerprint.from_json(H200_FP)
    assert (fp.gpu_name, fp.arch, fp.short_gpu) == ("NVIDIA H200", "sm_90", "H200")
    cpu = env.Fingerprint.from_json({"torch": "2.13.0+cpu"})
    assert (cpu.gpu_name, cpu.arch, cpu.short_gpu) == (None, "", "")


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc on PATH")
def test_nvcc_version_is_read_from_the_binary() -> None:
    nvcc = shutil.which("nvcc")
    assert nvcc is not None
    version = env.nvcc_version(nvcc)
    assert version is not None
    assert version.count(".") == 1
    assert dict(env.fingerprint().nvcc) == {version: nvcc}


@pytest.mark.integration
def test_nvcc_version_of_something_else_is_none() -> None:
    assert env.nvcc_version("/bin/true") is None
    assert env.nvcc_version("/no/such/nvcc") is None


def _fake_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        'echo "0, NVIDIA A100-SXM4-80GB, 8.0, 81920"\n'
        'echo "1, NVIDIA H200, 9.0, 143771"\n'
        'echo "2, NVIDIA H200, 9.0, 143771"\n'
    )
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")


@pytest.mark.integration
def test_gpu_list_from_nvidia_smi_follows_cuda_visible_devices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scheduler's GPU list without importing torch, numbered as the workers' CUDA will number them."""
    _fake_smi(tmp_path, monkeypatch)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    every = env.list_gpus()
    assert every is not None
    assert [(g["index"], g["capability"]) for g in every] == [(0, "8.0"), (1, "9.0"), (2, "9.0")]
    assert every[1] == {"index": 1, "name": "NVIDIA H200", "capability": "9.0", "memory_gib": 140.4}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    assert [(g["index"], g["name"]) for g in env.list_gpus() or []] == [
        (0, "NVIDIA H200"), (1, "NVIDIA A100-SXM4-80GB"),
    ]  # fmt: skip
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,7,0")  # CUDA stops at the first invalid entry
    assert [g["name"] for g in env.list_gpus() or []] == ["NVIDIA H200"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8a3c0b1e-0000")  # UUIDs: torch's probe decides
    assert env.list_gpus() is None


def test_gpu_workers_take_the_replay_path_from_their_first_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """OPGATE_REPLAY_BUILD=wait in GPU workers (a verdict must not depend on when a build lands)."""
    monkeypatch.delenv("OPGATE_REPLAY_BUILD", raising=False)
    cfg = WorkerConfig(logs=Path("/tmp/unused"))
    assert cfg.env("cuda", Gpu(0, "NVIDIA H200", "9.0"))["OPGATE_REPLAY_BUILD"] == "wait"
    assert "OPGATE_REPLAY_BUILD" not in cfg.env("cpu", None)  # no replay without CUDA
    monkeypatch.setenv("OPGATE_REPLAY_BUILD", "background")  # the user's own choice stays
    assert cfg.env("cuda", Gpu(0, "NVIDIA H200", "9.0"))["OPGATE_REPLAY_BUILD"] == "background"


def test_gpu_workers_number_gpus_as_nvidia_smi_does() -> None:
    cfg = WorkerConfig(logs=Path("/tmp/unused"))
    worker_env = cfg.env("cuda", Gpu(1, "NVIDIA H200", "9.0"))
    assert worker_env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
