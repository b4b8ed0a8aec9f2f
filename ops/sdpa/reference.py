"""torch SDPA as a library-backed op: which attention backend really runs?

``F.scaled_dot_product_attention`` picks a backend per call (cuDNN / flash /
memory-efficient / math).  On an H200 a non-contiguous last dimension silently
drops bf16 attention from cuDNN flash to the math path (GEMMs + softmax +
copies): numbers stay right, speed does not.  opgate validates it like any other
op, from this spec alone: ``sdpa`` is the entry under test, ``attention_math``
the plain reference (and float64 oracle).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from opgate.ops.base import SampleInput, randn


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
    """The library op under test (stock PyTorch dispatch, no adapter logic)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)


def attention_math(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False
) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v, written out: works in any dtype, float64 included."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if is_causal:
        s_q, s_k = scores.shape[-2], scores.shape[-1]
        mask = torch.ones(s_q, s_k, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    return torch.matmul(probs, v)


def sample_inputs(
    shape: tuple[int, ...], dtype: torch.dtype, device: str, generator: torch.Generator
) -> SampleInput:
    """``shape`` is (B, H, S, D); q, k and v all receive the cell's layout."""
    b, h, s, d = shape
    q, k, v = (randn((b, h, s, d), dtype, device, generator) for _ in range(3))
    return SampleInput(args=(q, k, v), kwargs={}, layout_args=(0, 1, 2), grad_args=(0, 1, 2))
