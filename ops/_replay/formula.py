"""An op's autograd formula as data: one definition for the Python and the C++ autograd.

Why data: opgate's Triton ops have the same backward shape — call the op's
backward op on the output gradients and some saved forward inputs/outputs,
hand its outputs back as the inputs' gradients.  Written as a :class:`Formula`,
it registers the Python autograd (``register_autograd``: CPU, the interpreter,
fake tensors, tracing) and is encoded for the C++ autograd kernel of the replay
path (:mod:`opgate.ops._replay`), so both run the same formula.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

#: Where a backward argument comes from: an output gradient, a forward argument, a forward output.
SOURCES = ("grad", "input", "output")


@dataclass(frozen=True)
class Formula:
    """``grads[i]`` = output ``grads[i]`` of ``backward(*args)`` is the gradient of forward argument i.

    ``args``: the backward op's arguments in order, each ``(source, index)``;
    ``grads``: one entry per forward argument (None: not differentiable);
    ``unsupported``: forward argument index -> the NotImplementedError raised
    when that argument's gradient is needed.
    Undefined output gradients reach the backward as zeros, as
    ``autograd.Function`` materializes them.
    """

    backward: str
    args: tuple[tuple[str, int], ...]
    grads: tuple[int | None, ...]
    unsupported: Mapping[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        bad = [a for a in self.args if a[0] not in SOURCES]
        if bad:
            raise ValueError(f"{self.backward}: formula argument sources must be one of {SOURCES}, got {bad}")
        if "::" not in self.backward:
            raise ValueError(f"backward op must be a qualname ns::name, got {self.backward!r}")

    def encode(self) -> str:
        """The text the C++ autograd kernel parses (``replay.cpp`` ``parse_formula``)."""
        args = " ".join(f"{src[0]}{k}" for src, k in self.args)
        grads = " ".join("-" if g is None else str(g) for g in self.grads)
        lines = [self.backward, args, grads]
        lines += [f"u{i} {msg}" for i, msg in sorted(self.unsupported.items())]
        if any("\n" in line for line in lines[3:]):
            raise ValueError(f"{self.backward}: unsupported-gradient messages must be one line")
        return "\n".join(lines)

    def backward_op(self) -> Any:
        ns, name = self.backward.split("::")
        return getattr(getattr(torch.ops, ns), name)

    def register(self, op: Any) -> None:
        """``op.register_autograd`` with this formula (``op``: a torch.library custom op)."""
        tensor_args = sorted({k for src, k in self.args if src == "input"})
        saved_outs = sorted({k for src, k in self.args if src == "output"})

        def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
            outs = output if isinstance(output, tuple) else (output,)
            tensors = [i for i in tensor_args if isinstance(inputs[i], torch.Tensor)]
            ctx.save_for_backward(*(inputs[i] for i in tensors), *(outs[k] for k in saved_outs))
            ctx.opgate_tensors = tensors
            ctx.opgate_scalars = {i: inputs[i] for i in tensor_args if i not in tensors}
            ctx.opgate_out_meta = [(o.shape, o.dtype, o.device) for o in outs]

        def backward(ctx: Any, *grads: Any) -> tuple[Any, ...]:
            for i, message in self.unsupported.items():
                if ctx.needs_input_grad[i]:
                    raise NotImplementedError(message)
            saved = ctx.saved_tensors
            n_in = len(ctx.opgate_tensors)
            ins = dict(zip(ctx.opgate_tensors, saved[:n_in], strict=True))
            ins.update(ctx.opgate_scalars)
            outs = dict(zip(saved_outs, saved[n_in:], strict=True))
            values = []
            for src, k in self.args:
                if src == "grad":
                    g = grads[k]
                    if g is None:
                        shape, dtype, device = ctx.opgate_out_meta[k]
                        g = torch.zeros(shape, dtype=dtype, device=device)
                    values.append(g)
                else:
                    values.append(ins[k] if src == "input" else outs[k])
            result = self.backward_op()(*values)
            result = result if isinstance(result, (tuple, list)) else (result,)
            return tuple(None if g is None else result[g] for g in self.grads)

        op.register_autograd(backward, setup_context=setup_context)
