"""GEMM (``torch.matmul``) as a library-backed op: which BLAS kernel ran.

On an H200, bf16/fp16 GEMMs run cuBLAS ``nvjet_sm90_*`` kernels and fp32 runs
``sm80_xmma_gemm_f32*`` / ``cutlass_80_simt_sgemm*``.  The spec's evidence
patterns make a silent change of library path visible in the compat matrix.
"""

from __future__ import annotations

import torch

from opgate.ops.base import SampleInput, randn


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The library op under test."""
    return torch.matmul(a, b)


def matmul_reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Product computed in float32 (float64 for the oracle), rounded to the input dtype."""
    acc = torch.float64 if a.dtype == torch.float64 else torch.float32
    return torch.matmul(a.to(acc), b.to(acc)).to(a.dtype)


def sample_inputs(
    shape: tuple[int, ...], dtype: torch.dtype, device: str, generator: torch.Generator
) -> SampleInput:
    """``shape`` is (M, K, N): a (M, K) @ (K, N); both operands take the cell's layout."""
    m, k, n = shape
    a = randn((m, k), dtype, device, generator)
    b = randn((k, n), dtype, device, generator)
    return SampleInput(args=(a, b), kwargs={}, layout_args=(0, 1), grad_args=(0, 1))
