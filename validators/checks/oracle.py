"""The float64 oracle: the reference run on float64 inputs, computing in float64 throughout.

Handing a reference float64 inputs is not enough.  Model code casts explicitly
(``xf = x.float(); ...; return y.to(x.dtype)``, Hugging Face's LlamaRMSNorm,
``torch.softmax(scores.float(), -1)``): on float64 inputs it computes in
float32 and converts back, and an "oracle" that is float32 underneath gives
the reference zero error in float32 cells (any op then fails by rounding
noise) and makes gradcheck's finite differences measure float32 noise.

:class:`Float64Casts` runs the reference with every low-precision floating
dtype it names mapped to float64: ``.float()`` / ``.half()`` / ``.bfloat16()``
become ``.double()``, and a ``torch.float32`` / ``float16`` / ``bfloat16``
passed anywhere as an argument (``.to(torch.float32)``, ``dtype=`` of a
factory or a reduction, ``F.softmax(..., dtype=...)``) becomes
``torch.float64``; tensors created without a dtype default to float64.  (So
inputs are drawn *before* entering it: ``torch.randn(..., dtype=torch.float32)``
inside would draw other numbers.)  The
reference's source is untouched: the same code is the reference in the cell's
dtype and the oracle in float64.

What the mapping cannot reach (a float32-only library kernel, a float32 tensor
captured in a closure) is found by :func:`audit`, which runs the oracle once
before any check under a dispatch mode that records every aten op producing a
floating tensor that is not float64, and names the reference's source line:
the cell is then ``error`` with that line and the fix, never a false ``fail``.
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from opgate.ops.base import SampleInput
from opgate.validators.checks.context import call, upcast

LOW_PRECISION = frozenset({torch.float32, torch.float16, torch.bfloat16})
_TO_DOUBLE = frozenset({torch.Tensor.float, torch.Tensor.half, torch.Tensor.bfloat16})
#: Frames inside these folders (torch, opgate's checks) or files are never "the reference's line".
_SKIP_DIRS = tuple(Path(p).resolve().parent for p in (torch.__file__, __file__))
_SKIP_FILES = frozenset({Path(contextlib.__file__).resolve()})


def _widen(value: Any) -> Any:
    return torch.float64 if isinstance(value, torch.dtype) and value in LOW_PRECISION else value


class Float64Casts(TorchFunctionMode):
    """Every low-precision floating dtype named by the code it runs means float64."""

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        if func in _TO_DOUBLE:
            func = torch.Tensor.double
        args = tuple(_widen(a) for a in args)
        kwargs = {k: _widen(v) for k, v in (kwargs or {}).items()}
        return func(*args, **kwargs)


@contextlib.contextmanager
def float64_casts() -> Iterator[None]:
    """Run the enclosed code with :class:`Float64Casts` on and float64 as the default dtype."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with Float64Casts():
            yield
    finally:
        torch.set_default_dtype(default)


def oracle(reference: Callable[..., Any], sample: SampleInput) -> Any:
    """The reference on float64 copies of the sample's floating inputs, in float64 throughout."""
    wide = upcast(sample)
    with float64_casts():
        return call(reference, wide)


def _caller() -> str:
    """``file:line`` of the innermost frame outside torch and opgate's validators (the reference's code)."""
    for frame in reversed(traceback.extract_stack()):
        path = Path(frame.filename).resolve()
        if path not in _SKIP_FILES and not any(path.is_relative_to(d) for d in _SKIP_DIRS):
            return f"{frame.filename}:{frame.lineno}"
    return "?"


class _LowPrecisionOps(TorchDispatchMode):
    """Records the first aten op whose floating output is not float64, and where it was called."""

    def __init__(self) -> None:
        TorchDispatchMode.__init__(self)  # not super(): mypy reads that as an untyped call
        self.found: str | None = None

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        if self.found is None:
            low = next(
                (
                    t.dtype
                    for t in pytree.tree_leaves(out)
                    if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64
                ),
                None,
            )
            if low is not None:
                name = str(getattr(func, "__name__", func))
                self.found = f"{name} computes in {str(low).removeprefix('torch.')} at {_caller()}"
        return out


def audit(reference: Callable[..., Any], sample: SampleInput) -> str | None:
    """Why the oracle of ``reference`` on ``sample`` is not float64, or None when it is.

    A reference that raises here is left to the checks (they report its error with context).
    """
    watch = _LowPrecisionOps()
    wide = upcast(sample)
    try:
        with torch.no_grad(), float64_casts(), watch:
            call(reference, wide)
    except Exception:  # noqa: BLE001 - the checks run the reference again and report what it raises
        return None
    if watch.found is None:
        return None
    return (
        f"the float64 oracle is not float64: {watch.found}; make the reference follow its input dtype "
        "(e.g. compute in torch.promote_types(x.dtype, torch.float32)) or use only float64-capable ops"
    )
