"""The op inside a small graph: a producer of its inputs and a consumer of its outputs.

An op compiled or exported on its own hides what a model sees.  Its outputs
flow straight back to the caller as real tensors, so a fake (meta) impl that
misdescribes them (wrong dtype, wrong strides) goes unnoticed, while the same
op followed by ``* 2 + 1`` in a model makes Inductor read the output as the
fake impl described it, and aborts.  So compile, cudagraphs and export cells
run ``consume(op(*produce(inputs)))``, and the reference runs through the very
same function (eagerly) for the numbers.

* producer: every *plain* tensor argument (contiguous, storage offset 0,
  16-byte aligned) enters the graph negated and is negated back inside it,
  so the op reads a tensor the graph computed, as in a model.  An argument in
  any other layout enters as it is: the cell's layout is what the op sees.
* consumer: every tensor output is negated inside the graph (``logical_not``
  for bool), a kernel generated from the fake impl's description of it.  The
  graph returns ``(outputs, consumed outputs)``: the outputs themselves too,
  or Inductor would drop an op whose consumer reads nothing (an empty batch).

Negation is exact in every dtype (twice is the identity, NaN stays NaN), so
the op reads exactly the cell's inputs, and both halves of what the graph
returns carry the op's own errors and poisoned-allocation NaNs; the reference
and its float64 oracle return the same pair.  The kernels the context adds are harness work: evidence leaves
them out (:func:`is_context_event`), by the names Inductor gives them
(``[graph_N_]cpp_fused_neg_0``, ``triton_poi_fused_neg_<op>_1``: the fused
aten ops, sorted, where the op's own name appears for the buffers it reads) and,
in eagerly run programs, as the ``aten::neg`` events and the kernels they launch.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from itertools import combinations
from typing import Any

import torch
from torch.utils import _pytree as pytree

from opgate.matrix.modes import MODES
from opgate.ops.base import SampleInput

#: Modes whose cells run the op inside the graph (:attr:`opgate.matrix.modes.Mode.in_graph`).
GRAPH_MODES = tuple(name for name, m in MODES.items() if m.in_graph)
#: Base-pointer alignment a plain argument keeps (Inductor allocates graph buffers aligned).
PLAIN_ALIGN = 16
#: Aten ops the context adds (what Inductor names its kernels after).
CONTEXT_OPS = ("neg", "logical_not")
#: Higher-order ops whose name Inductor may add to a kernel that feeds them (user Triton kernels).
WRAPPER_OPS = ("triton_kernel_wrapper_functional", "triton_kernel_wrapper_mutation")
_INDUCTOR_KERNEL = re.compile(r"^(?:graph_\d+_)?(?:cpp|triton_[a-z]+)_fused_(?P<ops>.+)_\d+$")
#: Eager events of the context (exported programs run their graph node by node).
CONTEXT_EVENTS = tuple(f"aten::{op}" for op in CONTEXT_OPS)

Plan = tuple[bool, ...]


def is_plain(a: Any) -> bool:
    """A tensor the producer can recreate exactly: contiguous, no storage offset, aligned."""
    return (
        isinstance(a, torch.Tensor)
        and a.is_contiguous()
        and a.storage_offset() == 0
        and (a.numel() == 0 or a.data_ptr() % PLAIN_ALIGN == 0)
    )


def _flip(t: Any) -> Any:
    if not isinstance(t, torch.Tensor):
        return t
    return torch.logical_not(t) if t.dtype == torch.bool else torch.neg(t)


def plan(sample: SampleInput) -> Plan:
    """Which positional arguments the producer makes inside the graph."""
    return tuple(is_plain(a) for a in sample.args)


def graph_inputs(sample: SampleInput, which: Plan) -> tuple[Any, ...]:
    """The positional arguments as the graph takes them: produced ones negated (outside the graph)."""
    return tuple(_flip(a) if p else a for a, p in zip(sample.args, which, strict=True))


def graph_of(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``graph(which, *args, **kwargs)``: produce the arguments ``which`` marks, call ``fn``, consume."""

    def graph(which: Plan, *args: Any, **kwargs: Any) -> Any:
        produced = [_flip(a) if p else a for a, p in zip(args, which, strict=True)]
        out = fn(*produced, **kwargs)
        return out, pytree.tree_map(_flip, out)

    graph.__name__ = graph.__qualname__ = f"in_graph_{getattr(fn, '__name__', 'op')}"
    return graph


def run_eagerly(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with its own signature, run through the same context without compiling (the reference)."""
    graph = graph_of(fn)

    def through_context(*args: Any, **kwargs: Any) -> Any:
        sample = SampleInput(args=tuple(args), kwargs=dict(kwargs))
        which = plan(sample)
        return graph(which, *graph_inputs(sample, which), **kwargs)

    through_context.__name__ = f"in_context_{getattr(fn, '__name__', 'reference')}"
    return through_context


def _context_kernel_names(own: Iterable[str]) -> frozenset[str]:
    """Every ``fused_<ops>`` suffix Inductor can give a kernel made of context ops only."""
    extra = [*own, *WRAPPER_OPS]
    names = set()
    for n_ctx in range(1, len(CONTEXT_OPS) + 1):
        for ctx_ops in combinations(CONTEXT_OPS, n_ctx):
            for n_own in range(len(extra) + 1):
                for own_ops in combinations(extra, n_own):
                    names.add("_".join(sorted({*ctx_ops, *own_ops})))
    return frozenset(names)


def context_kernel_matcher(qualname: str | None) -> Callable[[str], bool]:
    """``is_context_kernel(name)`` for the op ``qualname``: an Inductor kernel of the context alone.

    A kernel that fuses anything else (the aten ops a decomposed op became)
    is the op's work and stays evidence, even when it also negates.
    """
    own = [qualname.split("::", 1)[1].split(".", 1)[0]] if qualname and "::" in qualname else []
    allowed = _context_kernel_names(own)

    def is_context_kernel(name: str) -> bool:
        m = _INDUCTOR_KERNEL.match(name)
        return m is not None and m.group("ops") in allowed

    return is_context_kernel


def is_context_event(name: str, is_context_kernel: Callable[[str], bool]) -> bool:
    """An event the context caused: its eager ``aten::neg`` or one of its Inductor kernels."""
    return name in CONTEXT_EVENTS or is_context_kernel(name)
