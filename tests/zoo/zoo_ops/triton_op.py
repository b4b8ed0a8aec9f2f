"""``zoo::triton_op_rms_norm``: the zoo's kernel registered the way PyTorch's docs teach.

``torch.library.triton_op`` + ``wrap_triton``, autograd via ``register_autograd``,
no hand-written fake kernel (``triton_op`` uses the body itself, which must only
allocate and launch).  Block sizes are fixed rather than derived from the input's
sizes, so tracing the body with symbolic sizes specializes nothing: one compiled
graph serves every shape (the spec declares ``dynamic_shapes``).  Nothing planted.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
from torch.library import triton_op, wrap_triton

from zoo_ops.kernels import NATIVE, NEAREST, _zoo_rms_fwd_kernel, check, compute_type, interpreting
from zoo_ops.register import attach_autograd

BLOCK_M, BLOCK_N = 16, 512


@triton_op("zoo::triton_op_rms_norm", mutates_args=())
def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    check(x, w)
    M, N = x.shape
    y = x.new_empty((M, N))
    bf16_round = NEAREST if interpreting() and x.dtype == torch.bfloat16 else NATIVE
    ct = compute_type(x.dtype)

    def grid(meta: dict[str, Any]) -> tuple[int]:
        return (triton.cdiv(M, meta["BLOCK_M"]),)

    wrap_triton(_zoo_rms_fwd_kernel)[grid](
        x, w, y, M, N, x.stride(0), x.stride(1), w.stride(0), y.stride(0), y.stride(1), eps,
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, CT=ct, ACC=ct, ROUND_ACC=NATIVE, ROUND_OUT=bf16_round,
    )  # fmt: skip
    return y


attach_autograd(rms_norm)
