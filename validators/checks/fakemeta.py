"""fake_meta: the op's fake (meta) implementation must describe the outputs its kernel returns.

torch.compile and torch.export never run the kernel while tracing: they run
the fake impl and plan every consumer of the op's outputs from what it says.
A fake impl that lies (float32 where the kernel returns bfloat16, contiguous
strides where it returns a transposed buffer) passes an op compiled alone,
because the real output flows straight back to the caller; inside a model the
consumer reads the memory as the fake described it: wrong numbers, or a
process abort.  So in every mode the op runs on the cell's inputs twice, on
real tensors and under ``FakeTensorMode`` (same sizes, strides and storage
offset), and every output's shape, dtype, device and significant strides
(those of dimensions longer than 1) must agree.

A mismatch is a ``fail`` naming the output and what differs.  The mode's
artifact is then not built (``artifact.failure``): compiling the graph around
a lying op would only abort the worker.  An op that cannot run on fake tensors
outside a tracer is a ``skip`` with the reason; the mode's own check reports
what tracing makes of it.  A plain Python function (no torch.library op) is
never called under ``FakeTensorMode``: it has no fake impl, and on a GPU its
Triton launches would read fake tensors' null pointers (an illegal memory
access that poisons the worker); Dynamo traces such a body instead.  So is an op that tracing decomposes (a
CompositeImplicitAutograd kernel and no kernel of its own for the device):
its composite replaces the kernel in every traced graph, so no fake describes
the kernel, and the evidence check shows the kernel vanishing.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import _pytree as pytree

from opgate.validators.checks.base import Check, describe_exception
from opgate.validators.checks.context import CellContext, call
from opgate.validators.result import CheckResult, Verdict

NAME = "fake_meta"


def _fake_inputs(mode: Any, value: Any) -> Any:
    return mode.from_tensor(value) if isinstance(value, torch.Tensor) else value


def _leaves(out: Any) -> tuple[list[tuple[str, Any]], Any]:
    """(name, leaf) pairs and the tree structure of an op's outputs (``output``, ``output[1]``...)."""
    leaves, spec = pytree.tree_flatten_with_path(out)
    return [(f"output{pytree.keystr(path)}", leaf) for path, leaf in leaves], spec


def significant_strides(t: torch.Tensor) -> tuple[int | None, ...]:
    """Strides of the dims that have more than one element (None elsewhere); nothing for empty tensors."""
    if t.numel() == 0:
        return ()
    return tuple(st if n > 1 else None for n, st in zip(t.shape, t.stride(), strict=True))


def mismatches(fake: Any, real: Any) -> list[str]:
    """One line per output whose fake and real metadata differ (empty: they agree)."""
    fakes, fake_spec = _leaves(fake)
    reals, real_spec = _leaves(real)
    if fake_spec != real_spec:
        return [f"outputs: the fake impl returns {fake_spec}, the kernel returns {real_spec}"]
    found = []
    for (name, f), (_, r) in zip(fakes, reals, strict=True):
        if isinstance(f, torch.Tensor) != isinstance(r, torch.Tensor):
            found.append(f"{name}: the fake impl returns {type(f).__name__}, the kernel {type(r).__name__}")
            continue
        if not isinstance(r, torch.Tensor):
            continue
        for what, fv, rv in (
            ("shape", tuple(f.shape), tuple(r.shape)),
            ("dtype", f.dtype, r.dtype),
            ("device", f.device.type, r.device.type),
        ):
            if fv != rv:
                found.append(f"{name} {what}: the fake impl says {fv}, the kernel returns {rv}")
        if tuple(f.shape) == tuple(r.shape) and significant_strides(f) != significant_strides(r):
            fs, rs = tuple(f.stride()), tuple(r.stride())
            found.append(f"{name} strides: the fake impl says {fs}, the kernel returns {rs}")
    return found


def traced_through(qualname: str | None, device_kind: str) -> bool:
    """The op has a CompositeImplicitAutograd kernel and no kernel for the device: tracing decomposes it."""
    if not qualname:
        return False
    name = qualname.split(".", 1)[0]
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    backend = "CUDA" if device_kind == "cuda" else "CPU"
    return bool(has(name, "CompositeImplicitAutograd")) and not has(name, backend)


def applies(ctx: CellContext) -> str | None:
    if not ctx.impl.qualname:
        # A plain Python function (Liger's autograd.Function, a wrapper around a
        # Triton launch) has no fake impl: called under FakeTensorMode it runs its
        # body, and on a GPU its kernels launch on fake tensors' null pointers -- an
        # illegal memory access that poisons the worker.  Tracing (Dynamo) is the
        # only safe way to run such a body on fake tensors; the mode's check and the
        # evidence check report what it makes of it.
        return (
            "a Python function, not a torch.library op: it has no fake impl to compare "
            "(tracing runs its body instead)"
        )
    if traced_through(ctx.impl.qualname, ctx.device_kind):
        return (
            f"{ctx.impl.qualname} has a CompositeImplicitAutograd kernel: tracing runs that composite, "
            "not a fake impl (evidence shows whether the kernel still runs)"
        )
    return None


def _seen_shape(sample: Any, shape: tuple[int, ...]) -> list[int]:
    """The shape the op really saw (a zero-size layout empties the spec's shape)."""
    first = next((a for a in sample.args if isinstance(a, torch.Tensor)), None)
    return list(first.shape) if first is not None else list(shape)


def run(ctx: CellContext) -> CheckResult:
    from torch._subclasses.fake_tensor import FakeTensorMode

    compared: list[dict[str, Any]] = []
    for shape, sample in zip(ctx.shapes, ctx.inputs(), strict=True):
        try:
            with torch.no_grad():
                real = call(ctx.op, sample)
        except Exception as exc:  # noqa: BLE001 - the correctness check reports the op's own errors
            return CheckResult(
                NAME,
                Verdict.SKIP,
                f"the op raised on real inputs of shape {_seen_shape(sample, shape)} "
                f"({describe_exception(exc)}); correctness reports it",
                {"compared": compared},
            )
        mode = FakeTensorMode()
        fake_args = tuple(_fake_inputs(mode, a) for a in sample.args)
        fake_kwargs = {k: _fake_inputs(mode, v) for k, v in sample.kwargs.items()}
        try:
            with mode, torch.no_grad():
                fake = ctx.op(*fake_args, **fake_kwargs)
        except Exception as exc:  # noqa: BLE001 - an op that cannot run on fake tensors is reported, not fatal
            return CheckResult(
                NAME,
                Verdict.SKIP,
                f"the op does not run on fake tensors outside a tracer ({describe_exception(exc)}); "
                "its mode's own check reports what tracing makes of it",
                {"shape": list(shape), "exception": type(exc).__name__},
            )
        found = mismatches(fake, real)
        compared.append({"shape": list(shape), "mismatches": found})
        if found:
            reason = "; ".join(found) + f" (shape {_seen_shape(sample, shape)})"
            if ctx.artifact is not None and ctx.artifact.mode != "eager":
                ctx.artifact.failure = f"the fake impl misdescribes the op's output ({found[0]})"
            return CheckResult(NAME, Verdict.FAIL, reason, {"compared": compared})
    return CheckResult(
        NAME,
        Verdict.PASS,
        f"fake and real outputs agree in shape, dtype and strides ({len(compared)} shape(s))",
        {"compared": compared},
    )


CHECKS = (Check(NAME, applies, run),)
