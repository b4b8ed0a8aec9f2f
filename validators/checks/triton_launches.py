"""Child process of an external Triton library's build cell: which kernels does the op launch, and how?

A library written in Triton (Liger-Kernel) ships no binaries: its kernels are
compiled on the user's device at the first call, into Triton's cache.  The
build cell therefore asks the question that cache would answer on a device
of each claimed arch — do *the kernels this op launches* compile to SASS for
sm_80 and sm_90 with the installed Triton? — without a GPU and without
hand-written signatures:

1. here, under ``TRITON_INTERPRET=1``, the op's entry runs on the spec's
   sample inputs (CPU tensors) with every kernel launch intercepted: the
   launch's arguments give each parameter's Triton type (``*bf16``, ``i32``,
   ``fp32``) and each constexpr's value, its keywords the launch options
   (``num_warps``); the kernel body is not interpreted;
2. the parent hands those launches to :mod:`validators.checks.triton_build`,
   which cross-compiles each one for the cell's arch.

Prints one JSON line: ``{"launches": [{module, kernel, dtype, variant}], "error"?}``.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import sys
from pathlib import Path
from typing import Any

#: torch dtype -> Triton pointer element type
_TORCH_TO_TRITON = {
    "float32": "fp32",
    "float16": "fp16",
    "bfloat16": "bf16",
    "float64": "fp64",
    "int64": "i64",
    "int32": "i32",
    "int16": "i16",
    "int8": "i8",
    "uint8": "u8",
    "bool": "i1",
}
#: Launch keywords that are compile options, not kernel parameters.
_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")


def _arg_type(value: Any) -> str:
    import torch

    if isinstance(value, torch.Tensor):
        return "*" + _TORCH_TO_TRITON.get(str(value.dtype).removeprefix("torch."), "fp32")
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"cannot type a launch argument of type {type(value).__name__}")


def _constexpr(value: Any) -> Any:
    """JSON form of a constexpr: plain values as they are, a Triton dtype by its short name."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    name = str(value).removeprefix("triton.language.")
    short = {v: k for k, v in {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}.items()}
    return short.get(name, name)


def describe_launch(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], dtype: str) -> dict[str, Any]:
    """One launch as a build variant of ``fn`` (its Python function, as the interpreter holds it)."""
    params = list(inspect.signature(fn).parameters.values())
    bound = dict(zip((p.name for p in params), args, strict=False))
    bound.update({k: v for k, v in kwargs.items() if k not in _OPTIONS})
    signature: dict[str, str] = {}
    constexprs: dict[str, Any] = {}
    for p in params:
        is_const = "constexpr" in str(p.annotation)
        if p.name not in bound:
            continue  # a constexpr left to its default
        if is_const:
            constexprs[p.name] = _constexpr(bound[p.name])
        elif bound[p.name] is None:
            constexprs[p.name] = None
        else:
            signature[p.name] = _arg_type(bound[p.name])
    options = {k: kwargs[k] for k in _OPTIONS if k in kwargs}
    variant = {"signature": signature, "constexprs": constexprs, "options": options}
    return {"module": fn.__module__, "kernel": fn.__name__, "dtype": dtype, "variant": variant}


def record(entry: Any, samples: list[Any], dtype: str) -> list[dict[str, Any]]:
    """Run ``entry`` on each sample, intercepting every Triton launch; distinct launches, in order."""
    from triton.runtime.interpreter import InterpretedFunction

    seen: list[dict[str, Any]] = []
    original = InterpretedFunction.run

    def intercept(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
        launch = describe_launch(self.fn, args, kwargs, dtype)
        if launch not in seen:
            seen.append(launch)

    InterpretedFunction.run = intercept
    try:
        for sample in samples:
            # outputs are never written (no kernel body runs): later host code may trip on them
            with contextlib.suppress(Exception):
                entry(*sample.args, **sample.kwargs)
    finally:
        InterpretedFunction.run = original
    return seen


def main(request_json: str) -> dict[str, Any]:
    if os.environ.get("TRITON_INTERPRET") != "1":
        return {"error": "launch recording needs TRITON_INTERPRET=1"}
    req = json.loads(request_json)
    import torch

    from opgate.matrix.spec import resolve
    from opgate.ops.base import DTYPES

    root = Path(req["root"]) if req.get("root") else None
    entry = resolve(req["entry"], root)
    samples_fn = resolve(req["samples"], root)
    launches: list[dict[str, Any]] = []
    for dtype in req["dtypes"]:
        gen = torch.Generator().manual_seed(0)
        samples = [samples_fn(tuple(shape), DTYPES[dtype], "cpu", gen) for shape in req["shapes"]]
        launches += [x for x in record(entry, samples, dtype) if x not in launches]
    if not launches:
        return {"launches": [], "error": f"{req['entry']} launched no Triton kernel"}
    return {"launches": launches}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
