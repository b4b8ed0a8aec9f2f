"""``zoo_graph_break``: planted: the entry point reads a tensor value in Python before calling the op.

``float(w.abs().max())`` is data-dependent control flow: Dynamo cannot trace
it, so fullgraph compile fails and a plain compile splits into two graphs (one
graph break).  The op itself (``zoo::graph_break_rms_norm``) is correct.
"""

from __future__ import annotations

import torch

from zoo_ops.kernels import launch
from zoo_ops.register import register


def _forward(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return launch(x, w, eps)


_op = register("graph_break_rms_norm", _forward)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    if float(w.abs().max()) == 0.0:
        raise ValueError("zoo_graph_break: all-zero weight")
    out: torch.Tensor = _op(x, w, eps)
    return out
