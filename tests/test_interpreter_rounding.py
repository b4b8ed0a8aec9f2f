"""Under Triton's CPU interpreter a float32 -> bfloat16 store rounds to nearest even, as on the GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from opgate.validators.interpreter import bf16_bits

#: A kernel storing float32 values into a bfloat16 tensor, written the ordinary way; prints how
#: many of the stored bit patterns differ from torch's own rounding, with and without the patch.
PROBE = """
import json, sys, torch, triton, triton.language as tl
from opgate.validators.interpreter import round_bf16_to_nearest

@triton.jit
def _store(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)

def mismatches(x):
    y = torch.empty(x.shape, dtype=torch.bfloat16)
    _store[(triton.cdiv(x.numel(), 256),)](x, y, x.numel(), BLOCK=256)
    want = x.to(torch.bfloat16)
    same = (y.view(torch.int16) == want.view(torch.int16)) | (y.isnan() & want.isnan())
    return int((~same).sum())

x = torch.load(sys.argv[1])
before = mismatches(x)
patched = round_bf16_to_nearest()
print(json.dumps({"before": before, "after": mismatches(x), "patched": patched}))
"""


def _values() -> torch.Tensor:
    """Random values, exact ties (1 + 2^-8 lies halfway between two bfloat16s), and the edges."""
    ties = torch.tensor([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 2**-126 * (1 + 2**-8)], dtype=torch.float32)
    edges = torch.tensor(
        [0.0, -0.0, float("inf"), float("-inf"), float("nan"), 3.4028235e38, -3.4028235e38, 1e-45],
        dtype=torch.float32,
    )
    return torch.cat([torch.randn(1000, generator=torch.Generator().manual_seed(0)), ties, edges])


@pytest.mark.integration
def test_stored_bfloat16_matches_torch_bit_for_bit(tmp_path: Path) -> None:
    path = tmp_path / "x.pt"
    torch.save(_values(), path)
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    argv = [sys.executable, "-c", PROBE, str(path)]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["patched"] is True
    assert got["before"] > 100  # the interpreter truncates: the planted difference the patch removes
    assert got["after"] == 0


def test_bf16_bits_is_torchs_rounding() -> None:
    x = _values()
    want = x.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    got = bf16_bits(x.numpy())
    nan = np.isnan(x.numpy())
    assert (got[~nan] == want[~nan]).all()
    assert np.isnan(torch.from_numpy(got.view(np.int16)).view(torch.bfloat16).float().numpy()[nan]).all()
