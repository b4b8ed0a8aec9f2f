"""The decoder block (validators.perf.block) at a tiny size on CPU, and the planted slowdown kernel.

The Triton kernels run under TRITON_INTERPRET=1, which must be set before
Triton decorates them, so the GPU-free parts that launch kernels run in a
fresh interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from opgate.validators.perf.block import BlockConfig
from opgate.validators.perf.block_run import _flags
from opgate.validators.perf.planted import extra_elements

ROOT = Path(__file__).resolve().parent.parent

_SCRIPT = r"""
import dataclasses, json, torch
from opgate.validators.perf.block import BlockConfig, opgate_ops, parity, torch_ops
from opgate.validators.perf.planted import Planted, extra_pass
cfg = BlockConfig(hidden=64, heads=4, seq=16, batch=2, ffn=96)
ops = opgate_ops()
no_rope = dataclasses.replace(ops, name="no-rope", rope=lambda q, k, cos, sin, layout: (q, k))
out = {"bf16": parity(cfg, [ops, torch_ops(), no_rope], "cpu", torch.bfloat16),
       "fp32": parity(cfg, [ops], "cpu", torch.float32)}
x = torch.randn(3, 5000)
sink = extra_pass(x, 6000)
flat = x.flatten()
out["sink_err"] = max(abs(float(sink[0] - flat[:4096].sum())), abs(float(sink[1] - flat[4096:6000].sum())))
out["sink_len"] = sink.numel()
calls = []
planted = Planted(lambda a, b: calls.append(1) or a + b, 100)
out["planted_result_ok"] = bool(torch.equal(planted(x, x), 2 * x)) and calls == [1]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def tiny() -> dict[str, Any]:
    env = {
        **os.environ,
        "TRITON_INTERPRET": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, (os.environ.get("PYTHONPATH"), str(ROOT)))),
    }
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    record: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return record


@pytest.mark.integration
def test_block_parity_opgate_matches_stock_pytorch(tiny: dict[str, Any]) -> None:
    bf16 = tiny["bf16"]
    # bf16 rounding of a few matmuls: both variants land near 1e-3..1e-2 of the float32 block
    assert 0 < bf16["torch"] < 2e-2
    assert bf16["opgate-triton"] <= 2 * bf16["torch"] + 1e-3
    assert tiny["fp32"]["opgate-triton"] < 1e-5


@pytest.mark.integration
def test_block_parity_catches_a_broken_op(tiny: dict[str, Any]) -> None:
    assert tiny["bf16"]["no-rope"] > 20 * tiny["bf16"]["torch"]


@pytest.mark.integration
def test_planted_extra_pass_reads_the_slice_it_is_given(tiny: dict[str, Any]) -> None:
    assert tiny["sink_len"] == 2  # 6000 elements in blocks of 4096
    assert tiny["sink_err"] < 1e-2
    assert tiny["planted_result_ok"]


def test_extra_elements_sizes_the_slowdown() -> None:
    nbytes = 2 * 8192 * 8192 * 2 + 8192 * 2  # rms_norm bf16 8192x8192
    n = extra_elements(nbytes, 8192 * 8192, 2, 0.10)
    assert n * 2 == pytest.approx(0.10 * nbytes, abs=2)  # extra bytes = 10% of the op's bytes
    assert 0.19 < n / (8192 * 8192) < 0.21  # ~20% of x re-read
    with pytest.raises(ValueError, match="one pass over x is not enough"):
        extra_elements(nbytes, 8192 * 8192, 2, 0.6)
    with pytest.raises(ValueError, match="slowdown must be"):
        extra_elements(nbytes, 8192 * 8192, 2, 0.0)


def test_block_config_checks_heads() -> None:
    with pytest.raises(ValueError, match="heads"):
        BlockConfig(hidden=100, heads=3)
    assert BlockConfig().head_dim == 128


def _t(us: float) -> dict[str, float]:
    return {"median_us": us}


def test_faster_alone_slower_in_block_is_flagged() -> None:
    blocks = {"forward": {"opgate/eager": _t(110), "torch/eager": _t(100), "opgate/compile": _t(90),
                          "torch/compile": _t(95)}}  # fmt: skip
    alone = {
        "rms_norm": {"opgate": _t(5), "torch": _t(8), "torch-compile": _t(4)},
        "silu_mul": {"opgate": _t(9), "torch": _t(7), "torch-compile": _t(6)},
    }
    flags = _flags(blocks, alone)
    assert [(f["op"], f["mode"]) for f in flags] == [("rms_norm", "eager")]
    assert flags[0]["flag"] == "faster alone, slower in the block"
    blocks["forward"]["opgate/eager"] = _t(99)
    assert _flags(blocks, alone) == []
