"""A forward-only op, registered the ordinary way: ``custom_op`` + ``register_fake``, no backward.

Its two sample-input functions differ only in ``grad_args``: left to the
default (every floating tensor is differentiable) and declared ``()``.
"""

from __future__ import annotations

import torch

from opgate.ops.base import SampleInput, randn


@torch.library.custom_op("fwdonly::double", mutates_args=())
def double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@double.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def reference(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def samples_undeclared(
    shape: tuple[int, ...], dtype: torch.dtype, device: str, generator: torch.Generator
) -> SampleInput:
    return SampleInput(args=(randn(tuple(shape), dtype, device, generator),))


def samples_forward_only(
    shape: tuple[int, ...], dtype: torch.dtype, device: str, generator: torch.Generator
) -> SampleInput:
    return SampleInput(args=(randn(tuple(shape), dtype, device, generator),), grad_args=())
