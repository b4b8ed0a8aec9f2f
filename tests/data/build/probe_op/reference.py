"""Reference for the planted probe op (never run by the build tests)."""

from __future__ import annotations

import torch


def probe(x: torch.Tensor) -> torch.Tensor:
    return 2.0 * x


def sample_inputs(
    shape: tuple[int, ...], dtype: torch.dtype, device: str, generator: torch.Generator
) -> object:
    raise NotImplementedError("the probe op is only built, never run")
