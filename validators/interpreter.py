"""Triton's CPU interpreter made to round to bfloat16 as the GPU does.

CPU cells run Triton kernels under ``TRITON_INTERPRET=1``.  Its cast from
float32 to bfloat16 (every ``tl.store`` of a float32 value into a bfloat16
tensor, every ``.to(tl.bfloat16)``) *truncates* the mantissa, while the GPU
(``cvt.rn.bf16.f32``) and PyTorch round to nearest, ties to even.  Truncation
doubles the rounding error, so a correct kernel written the ordinary way
fails the tolerance rule in bf16 on CPU only: a false alarm about the
interpreter, not about the op.  :func:`round_bf16_to_nearest` replaces that
one conversion with round-to-nearest-even in integer arithmetic (NaN stays a
quiet NaN, overflow goes to infinity), once per worker process.  Every other
conversion is left to the interpreter.
"""

from __future__ import annotations

import functools
from typing import Any

#: Float widths the patched conversion accepts as its source (bfloat16's own stays untouched).
_SOURCES = ("fp16", "fp32", "fp64")


def bf16_bits(values: Any) -> Any:
    """bfloat16 bit patterns (``uint16``) of ``values``, rounded to nearest, ties to even."""
    import numpy as np

    data = np.asarray(values, dtype=np.float32)
    bits = data.view(np.uint32)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    nan = np.isnan(data)
    if nan.any():
        rounded[nan] = ((bits[nan] >> 16) | np.uint32(0x0040)).astype(np.uint16)
    return rounded.reshape(data.shape)


@functools.cache
def round_bf16_to_nearest() -> bool:
    """Patch the interpreter's casts to bfloat16 (idempotent); False where there is no interpreter."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    builder = getattr(interpreter, "InterpreterBuilder", None)
    handle = getattr(interpreter, "TensorHandle", None)
    original = getattr(builder, "cast_impl", None)
    if builder is None or handle is None or original is None:
        return False
    sources = {getattr(tl, {"fp16": "float16", "fp32": "float32", "fp64": "float64"}[s]) for s in _SOURCES}

    def cast_impl(self: Any, src: Any, dst_type: Any) -> Any:
        if dst_type.scalar == tl.bfloat16 and src.dtype.scalar in sources:
            return handle(bf16_bits(src.data), dst_type.scalar)
        return original(self, src, dst_type)

    builder.cast_impl = cast_impl
    return True
