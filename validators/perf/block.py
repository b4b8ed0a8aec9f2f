"""A small decoder block, run with opgate's ops and with stock PyTorch: parity and step time.

An op that is 10% faster alone can make a model slower: an extra copy where
its input is a strided view, a layout the next op dislikes, a lost Inductor
fusion under torch.compile.  Only a block shows it.  This one is a
Llama-style pre-norm layer with random weights (nothing downloaded)::

    h = rms_norm(x);  q, k, v = split(h @ Wqkv)          # q, k, v: strided views
    q, k = rope(q, k)  (B, S, H, D);  a = sdpa(q, k, v, causal) @ Wo
    y, r = fused_add_rms_norm(a, x)                       # r = a + x
    out = r + silu_mul(split(y @ Wgu)) @ Wdown            # gate/up: strided views

Variant ``opgate`` takes the four ops from their specs (``triton``
implementations); variant ``torch`` uses ``F.rms_norm``, ``x + r`` then
``F.rms_norm``, ``F.silu(a) * b`` and rotate-half RoPE.  Everything else
(GEMMs, SDPA) is shared.  Parity is the normwise relative error of each
variant against the same block run in float32 on float32 copies of the
weights.  Timing lives in :mod:`validators.perf.block_run`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

BLOCK_OPS = ("rms_norm", "fused_add_rms_norm", "silu_mul", "rope")


@dataclass(frozen=True)
class BlockConfig:
    hidden: int = 2048
    heads: int = 16
    seq: int = 2048
    batch: int = 4
    ffn: int = 5632
    dtype: str = "bf16"
    eps: float = 1e-6
    seed: int = 0

    def __post_init__(self) -> None:
        if self.hidden % self.heads or (self.hidden // self.heads) % 2:
            raise ValueError(f"hidden {self.hidden} must split into {self.heads} heads of even size")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


@dataclass(frozen=True)
class Ops:
    """The four block ops of one variant, each with its op's reference signature."""

    name: str
    rms_norm: Callable[..., torch.Tensor]
    fused_add_rms_norm: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    silu_mul: Callable[..., torch.Tensor]
    rope: Callable[..., tuple[torch.Tensor, torch.Tensor]]


def _torch_rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), w, eps)


def _torch_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    h = x + residual
    return F.rms_norm(h, (h.shape[-1],), w, eps), h


def _torch_silu_mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.silu(a) * b


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _torch_rope(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str = "bshd"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stock rotate-half RoPE as models write it (in the input dtype), (B, S, H, D) only."""
    if layout != "bshd":
        raise ValueError(f"the block uses layout bshd, got {layout!r}")
    c, s = cos[:, None, :], sin[:, None, :]
    return q * c + _rotate_half(q) * s, k * c + _rotate_half(k) * s


def torch_ops() -> Ops:
    return Ops("torch", _torch_rms_norm, _torch_add_rms_norm, _torch_silu_mul, _torch_rope)


def opgate_ops(impl: str = "triton") -> Ops:
    """opgate's ops, from the specs' ``impl`` entries (module paths ``ops.<op>.triton_impl`` if no spec)."""
    import importlib

    from opgate.matrix.spec import load_specs, resolve

    try:
        specs = load_specs()
    except Exception:  # noqa: BLE001 - a broken unrelated spec must not hide the block
        specs = {}
    found: dict[str, Any] = {}
    for op in BLOCK_OPS:
        spec = specs.get(op)
        if spec is not None and impl in spec.implementations:
            entry = spec.implementations[impl]
            importlib.import_module(entry.module)
            found[op] = resolve(entry.entry, spec.root)
        else:
            found[op] = resolve(f"opgate.ops.{op}.{impl}_impl:{op}")
    return Ops(f"opgate-{impl}", **found)


def rope_tables(
    seq: int, dim: int, dtype: torch.dtype, device: torch.device | str
) -> tuple[torch.Tensor, ...]:
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    freqs = torch.outer(torch.arange(seq, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(device=device, dtype=dtype), emb.sin().to(device=device, dtype=dtype)


class DecoderBlock(nn.Module):
    """The block above; ``ops`` picks the variant, the weights are the module's parameters."""

    def __init__(self, cfg: BlockConfig, ops: Ops) -> None:
        super().__init__()
        self.cfg, self.ops = cfg, ops
        h, f = cfg.hidden, cfg.ffn
        self.norm1 = nn.Parameter(torch.empty(h))
        self.wqkv = nn.Parameter(torch.empty(3 * h, h))
        self.wo = nn.Parameter(torch.empty(h, h))
        self.norm2 = nn.Parameter(torch.empty(h))
        self.wgu = nn.Parameter(torch.empty(2 * f, h))
        self.wdown = nn.Parameter(torch.empty(h, f))

    def init_weights(self, generator: torch.Generator) -> None:
        """Random weights (scaled so activations stay O(1)), drawn on CPU from ``generator``."""
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.startswith("norm"):
                    p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=generator))
                else:
                    p.copy_(torch.randn(p.shape, generator=generator) / p.shape[1] ** 0.5)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        cfg, ops = self.cfg, self.ops
        b, s, hid = x.shape
        h = ops.rms_norm(x, self.norm1, cfg.eps)
        q, k, v = F.linear(h, self.wqkv).split(hid, dim=-1)
        shape = (b, s, cfg.heads, cfg.head_dim)
        q, k = ops.rope(q.view(shape), k.view(shape), cos, sin, "bshd")
        attn = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.view(shape).transpose(1, 2), is_causal=True
        )
        a = F.linear(attn.transpose(1, 2).reshape(b, s, hid), self.wo)
        y, r = ops.fused_add_rms_norm(a, x, self.norm2, cfg.eps)
        gate, up = F.linear(y, self.wgu).chunk(2, dim=-1)
        return r + F.linear(ops.silu_mul(gate, up), self.wdown)


def build(cfg: BlockConfig, ops: Ops, device: torch.device | str, dtype: torch.dtype) -> DecoderBlock:
    """A block with the config's seeded weights: every variant and dtype gets the same values."""
    block = DecoderBlock(cfg, ops)
    block.init_weights(torch.Generator().manual_seed(cfg.seed))
    return block.to(device=device, dtype=dtype)


def inputs(
    cfg: BlockConfig, device: torch.device | str, dtype: torch.dtype, requires_grad: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x, cos, sin): seeded activations (B, S, hidden) and RoPE tables (S, D)."""
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    x = torch.randn((cfg.batch, cfg.seq, cfg.hidden), generator=gen).to(device=device, dtype=dtype)
    cos, sin = rope_tables(cfg.seq, cfg.head_dim, dtype, device)
    return x.requires_grad_(requires_grad), cos, sin


def relerr(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Normwise relative error max|out - ref| / max|ref| (inf when out is not finite)."""
    o, r = out.double(), ref.double()
    if not torch.isfinite(o).all():
        return float("inf")
    return float((o - r).abs().max() / r.abs().max().clamp_min(1e-30))


def parity(
    cfg: BlockConfig, variants: list[Ops], device: torch.device | str, dtype: torch.dtype
) -> dict[str, float]:
    """Each variant's relative error against the float32 block (stock ops, fp32 weights and input)."""
    with torch.no_grad():
        x, cos, sin = inputs(cfg, device, dtype)
        ref = build(cfg, torch_ops(), device, torch.float32)(x.float(), cos.float(), sin.float())
        return {ops.name: relerr(build(cfg, ops, device, dtype)(x, cos, sin), ref) for ops in variants}
