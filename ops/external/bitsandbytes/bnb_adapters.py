"""Adapters from opgate's op signatures to bitsandbytes' functional API.

bitsandbytes is validated from specs alone: these functions only translate
argument conventions, so every verdict is the library's:

* ``quantize_4bit`` returns the packed bytes as a (numel/2, 1) column and a
  ``QuantState``; the op's contract is the flat bytes and the absmax tensor
  (a view and an attribute, nothing computed);
* ``dequantize_4bit`` takes a ``QuantState`` (absmax in float32, the output
  shape and dtype); the op carries absmax in the output dtype (its values are
  exact in float32), so the adapter widens it and names the shape.
"""

from __future__ import annotations

import torch
from bitsandbytes import functional as bnbf
from nf4_reference import BLOCKSIZE


def quantize_nf4(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    packed, state = bnbf.quantize_4bit(x, blocksize=BLOCKSIZE, quant_type="nf4")
    return packed.view(-1), state.absmax


def dequantize_nf4(packed: torch.Tensor, absmax: torch.Tensor) -> torch.Tensor:
    rows, half = packed.shape
    state = bnbf.QuantState(
        absmax=absmax.float(),
        shape=torch.Size((rows, 2 * half)),
        blocksize=BLOCKSIZE,
        quant_type="nf4",
        dtype=absmax.dtype,
    )
    out: torch.Tensor = bnbf.dequantize_4bit(packed, quant_state=state)
    return out
