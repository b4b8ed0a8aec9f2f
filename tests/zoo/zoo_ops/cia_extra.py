"""``zoo::cia_extra_rms_norm``: planted: a proper custom op, plus a CompositeImplicitAutograd kernel.

The op is registered the recommended way (``torch.library.custom_op`` with a
fake impl and autograd), and then a composite is added "for devices without
the kernel".  Eager calls run the Triton kernel, ``torch.export`` keeps the op
as a node, opcheck passes; but every tracer takes the composite: under
torch.compile Inductor runs its own code, and ``ep.run_decompositions()`` (the
program AOTInductor and ExecuTorch lower) holds aten ops instead of the op.
"""

from __future__ import annotations

import torch

from zoo_ops.kernels import launch
from zoo_ops.reference import rms_norm as _composite
from zoo_ops.register import register


def _forward(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return launch(x, w, eps)


rms_norm = register("cia_extra_rms_norm", _forward)
_lib = torch.library.Library("zoo", "FRAGMENT")
_lib.impl("cia_extra_rms_norm", _composite, "CompositeImplicitAutograd")
