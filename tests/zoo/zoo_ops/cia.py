"""``zoo::cia_rms_norm``: planted: a CompositeImplicitAutograd registration (kernel gone under compile).

The body launches the Triton kernel for plain tensors in inference, and falls
back to a traceable aten composite otherwise (fake/functional tensors, or
inputs that need autograd).  Eager inference runs the kernel; torch.compile
and torch.export trace *through* the op (CIA ops are decomposed), so Inductor
runs its own fused kernel and the op event disappears.  opcheck passes it
(measured on the H200 too): only the profiler evidence catches it.
"""

from __future__ import annotations

import torch

from zoo_ops.kernels import launch
from zoo_ops.reference import rms_norm as _composite

_lib = torch.library.Library("zoo", "FRAGMENT")
_lib.define("cia_rms_norm(Tensor x, Tensor w, float eps=1e-06) -> Tensor")


def _cia_rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    plain = type(x) is torch.Tensor and type(w) is torch.Tensor
    needs_grad = torch.is_grad_enabled() and (x.requires_grad or w.requires_grad)
    if plain and not needs_grad:
        return launch(x, w, eps)
    return _composite(x, w, eps)


_lib.impl("cia_rms_norm", _cia_rms_norm, "CompositeImplicitAutograd")


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    out: torch.Tensor = torch.ops.zoo.cia_rms_norm(x, w, eps)
    return out
