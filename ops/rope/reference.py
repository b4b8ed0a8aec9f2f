"""Plain PyTorch rotary position embedding (rotate-half convention): reference and oracle.

out = x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2]),
for q and k in (B, S, H, D) ("bshd") or (B, H, S, D) ("bhsd"); cos/sin are (S, D)
or (B, S, D).  Computed in float32 (float64 stays float64), rounded once.
"""

from __future__ import annotations

import torch

from opgate.ops.base import SampleInput, randn

LAYOUTS = ("bshd", "bhsd")


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _to_heads(t: torch.Tensor, layout: str, acc: torch.dtype) -> torch.Tensor:
    t = t.to(acc)
    if t.dim() == 2:
        t = t.unsqueeze(0)
    return t.unsqueeze(2) if layout == "bshd" else t.unsqueeze(1)


def rope(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str = "bshd"
) -> tuple[torch.Tensor, torch.Tensor]:
    if layout not in LAYOUTS:
        raise ValueError(f"rope: layout must be one of {LAYOUTS}, got {layout!r}")
    acc = torch.promote_types(q.dtype, torch.float32)
    c, s = _to_heads(cos, layout, acc), _to_heads(sin, layout, acc)
    qf, kf = q.to(acc), k.to(acc)
    return (qf * c + _rotate_half(qf) * s).to(q.dtype), (kf * c + _rotate_half(kf) * s).to(k.dtype)


def rope_tables(
    seq: int, dim: int, dtype: torch.dtype, device: str, base: float = 10000.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """The usual cos/sin tables (S, D): frequencies repeated over both halves."""
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    freqs = torch.outer(torch.arange(seq, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(device=device, dtype=dtype), emb.sin().to(device=device, dtype=dtype)


def sample_inputs(
    shape: tuple[int, ...], dtype: torch.dtype, device: str, generator: torch.Generator
) -> SampleInput:
    """``shape`` = [B, S, H, D, L]: L = 0 -> layout "bshd", 1 -> "bhsd" (so one shape set covers both).

    k has max(1, H // 2) heads (grouped-query attention), q has H.
    """
    if len(shape) != 5 or shape[4] not in (0, 1):
        raise ValueError(f"rope shapes are [B, S, H, D, L] with L in (0, 1), got {list(shape)}")
    b, s, h, d, code = shape
    layout = LAYOUTS[code]
    hk = max(1, h // 2)

    def dims(heads: int) -> tuple[int, int, int, int]:
        return (b, s, heads, d) if layout == "bshd" else (b, heads, s, d)

    q = randn(dims(h), dtype, device, generator)
    k = randn(dims(hk), dtype, device, generator)
    cos, sin = rope_tables(s, d, dtype, device)
    return SampleInput(
        args=(q, k, cos, sin),
        kwargs={"layout": layout},
        layout_args=(0, 1),
        grad_args=(0, 1),
        broadcastable=(2, 3),
    )
