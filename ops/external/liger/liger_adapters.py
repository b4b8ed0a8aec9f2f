"""Adapters from opgate's op signatures to Liger-Kernel's functional API.

Liger-Kernel is validated from specs alone: these functions only translate
argument conventions (no copies, no dtype changes, no behaviour of their own),
so every verdict is Liger's.  ``opgate perf bench`` times the same functions as
the ``liger`` peer of the opgate op of the same name
(:func:`opgate.validators.perf.peers.liger_peer`).  Where Liger mutates an input in place by default
(``in_place=True`` in its RMSNorm), the out-of-place mode is asked for, since
opgate's contract is a functional op.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from liger_kernel.transformers.functional import (
    liger_layer_norm,
    liger_rms_norm,
    liger_rope,
    liger_swiglu,
)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    out: torch.Tensor = liger_rms_norm(x, w, eps, in_place=False)
    return out


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual) * w, x + residual), as opgate::fused_add_rms_norm returns them.

    Imported here, not above: Liger releases before its fused add-RMSNorm still
    validate the other four ops.
    """
    from liger_kernel.transformers.functional import liger_fused_add_rms_norm

    out: tuple[torch.Tensor, torch.Tensor] = liger_fused_add_rms_norm(x, residual, w, eps)
    return out


def silu_mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    out: torch.Tensor = liger_swiglu(a, b)
    return out


def layer_norm(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float = 1e-5, gelu: bool = False
) -> torch.Tensor:
    """Liger's LayerNorm; the GELU variant is Liger's norm followed by ``F.gelu`` (Liger fuses none)."""
    y: torch.Tensor = liger_layer_norm(x, w, b, eps)
    return F.gelu(y) if gelu else y


def rope(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str = "bshd"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Liger takes (B, H, S, D); a (B, S, H, D) input is passed as its transposed *view*."""
    if layout == "bshd":
        qo, ko = liger_rope(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
        return qo.transpose(1, 2), ko.transpose(1, 2)
    qo, ko = liger_rope(q, k, cos, sin)
    return qo, ko
