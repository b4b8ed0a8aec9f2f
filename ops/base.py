"""What every op's ``sample_inputs`` returns, and small helpers op authors share.

One sample-inputs function per op feeds every check (correctness, gradients,
opcheck, compile, export, evidence, perf): validators only ever transform what
it returns (layouts, dtypes, float64 upcast), so an op cannot be tested on
inputs its author never saw.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class SampleInput:
    """Contiguous inputs for one shape (every field is described in ``ops/SPEC.md``).

    ``args``/``kwargs``: the call, ``op(*args, **kwargs)``, for the op, the
    reference and (upcast) the float64 oracle.  ``layout_args``: positions of
    tensor args that receive the cell's layout (e.g. ``x`` but not the weight
    ``w``).  ``grad_args``: positions of differentiable tensor args; by default
    every floating-point tensor in ``args`` (what autograd would differentiate),
    and ``()`` for a forward-only op, whose gradient checks then do not apply.
    ``broadcastable``: positions whose value may be a stride-0 expanded view
    (only then is the ``broadcast`` layout generated).
    """

    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    layout_args: tuple[int, ...] = (0,)
    grad_args: tuple[int, ...] | None = None  # None: every floating tensor (see differentiable)
    broadcastable: tuple[int, ...] = ()

    def differentiable(self) -> tuple[int, ...]:
        """``grad_args``, or (not given) the position of every floating-point tensor in ``args``."""
        if self.grad_args is not None:
            return tuple(self.grad_args)
        args = self.args
        return tuple(i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.is_floating_point())

    def tensors(self) -> list[torch.Tensor]:
        return [a for a in self.args if isinstance(a, torch.Tensor)]


DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp64": torch.float64,
}


def randn(
    shape: tuple[int, ...], dtype: torch.dtype, device: str, generator: torch.Generator
) -> torch.Tensor:
    """Random normal data drawn on CPU (reproducible from the seed on any device)."""
    return torch.randn(shape, dtype=torch.float32, generator=generator).to(device=device, dtype=dtype)
