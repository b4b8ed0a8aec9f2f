"""NF4 blockwise 4-bit quantization written from its published definition (QLoRA, Dettmers et al. 2023).

NormalFloat4 represents each value of a block as one of 16 levels: the
quantiles of N(0, 1) normalised to [-1, 1], asymmetric so that 0 is exact
(8 positive levels including 1, 7 negative ones, and 0).  The values below are
the table published with the format.  A block of ``BLOCKSIZE`` consecutive
elements (the tensor flattened in logical row-major order) is scaled by its
absolute maximum ``absmax`` (kept in float32); each scaled value takes the
index of its nearest level, and two 4-bit indices share a byte, the first
element in the high nibble.  Dequantization is ``level[index] * absmax``.

Computed in float32 (float64 stays float64, so the same functions are the
oracle) and rounded once at the end.  A block whose absmax is 0 quantizes to
the index of level 0.
"""

from __future__ import annotations

import torch

from opgate.ops.base import SampleInput

#: Elements per absmax block (bitsandbytes' default for 4-bit weights).
BLOCKSIZE = 64
#: The 16 NF4 levels, ascending (index = 4-bit code).
NF4_LEVELS = (
    -1.0,
    -0.6961928009986877,
    -0.5250730514526367,
    -0.39491748809814453,
    -0.28444138169288635,
    -0.18477343022823334,
    -0.09105003625154495,
    0.0,
    0.07958029955625534,
    0.16093020141124725,
    0.24611230194568634,
    0.33791524171829224,
    0.44070982933044434,
    0.5626170039176941,
    0.7229568362236023,
    1.0,
)


def _work(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _blocks(flat: torch.Tensor) -> torch.Tensor:
    """``flat`` zero-padded to whole blocks, as (blocks, BLOCKSIZE)."""
    n = flat.numel()
    blocks = -(-n // BLOCKSIZE)
    padded = torch.zeros(blocks * BLOCKSIZE, dtype=flat.dtype, device=flat.device)
    padded[:n] = flat
    return padded.view(blocks, BLOCKSIZE)


def quantize_nf4(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed uint8 of numel/2 bytes, absmax float32 per block) of ``x`` (numel even)."""
    work = _work(x.dtype)
    flat = x.reshape(-1).to(work)
    blocks = _blocks(flat)
    absmax = blocks.abs().amax(dim=1)
    scale = torch.where(absmax > 0, absmax, torch.ones_like(absmax))
    scaled = blocks / scale[:, None]
    levels = torch.tensor(NF4_LEVELS, dtype=work, device=x.device)
    index = (scaled[..., None] - levels).abs().argmin(dim=-1).reshape(-1)[: flat.numel()]
    packed = (index[0::2] << 4) | index[1::2]
    return packed.to(torch.uint8), absmax.to(torch.float32)


def dequantize_nf4(packed: torch.Tensor, absmax: torch.Tensor) -> torch.Tensor:
    """``packed`` (rows, cols/2) uint8 and one absmax per block -> (rows, cols) in absmax's dtype."""
    work = _work(absmax.dtype)
    rows, half = packed.shape
    byte = packed.reshape(-1).to(torch.int64)
    index = torch.stack((byte >> 4, byte & 15), dim=-1).reshape(-1)
    levels = torch.tensor(NF4_LEVELS, dtype=work, device=packed.device)
    blocks = _blocks(levels[index])
    values = blocks * absmax.to(work)[: blocks.shape[0], None]
    return values.reshape(-1)[: rows * 2 * half].view(rows, 2 * half).to(absmax.dtype)


#: Fraction of each level's decision interval kept clear at both ends by :func:`quantize_samples`.
MARGIN = 0.15


def quantize_samples(
    shape: tuple[int, ...], dtype: torch.dtype, device: str, generator: torch.Generator
) -> SampleInput:
    """x of ``shape`` (a weight to store in 4 bits) whose every value lies well inside one level's interval.

    Why not plain ``randn``: a value within an ulp of a decision boundary (the
    midpoint of two levels) legitimately quantizes either way depending on the
    order of roundings (``x / absmax`` or ``x * (1 / absmax)``), and a 4-bit code
    off by one is 16 in a packed byte.  Each block of 64 (flattened) gets an
    absmax drawn in ``dtype`` and one element equal to it; every other element
    is a random level's interval, ``MARGIN`` clear of its ends, so a wrong level,
    block, packing or stride still shows, but a tie cannot.
    """
    n = 1
    for size in shape:
        n *= size
    blocks = -(-n // BLOCKSIZE)
    levels = torch.tensor(NF4_LEVELS, dtype=torch.float64)
    mids = (levels[1:] + levels[:-1]) / 2
    lo = torch.cat((levels[:1], mids))
    hi = torch.cat((mids, levels[-1:]))
    code = torch.randint(0, 16, (blocks * BLOCKSIZE,), generator=generator)
    t = MARGIN + (1 - 2 * MARGIN) * torch.rand(blocks * BLOCKSIZE, generator=generator, dtype=torch.float64)
    scaled = (lo[code] + t * (hi[code] - lo[code])).view(blocks, BLOCKSIZE)
    scaled[:, 0] = torch.where(torch.rand(blocks, generator=generator) < 0.5, -1.0, 1.0)
    absmax = (0.5 + 2.5 * torch.rand(blocks, generator=generator, dtype=torch.float64)).to(dtype)
    x = (scaled * absmax.to(torch.float64)[:, None]).reshape(-1)[:n].to(dtype).view(shape)
    return SampleInput(args=(x.to(device),), layout_args=(0,), grad_args=())


def dequantize_samples(
    shape: tuple[int, ...], dtype: torch.dtype, device: str, generator: torch.Generator
) -> SampleInput:
    """Packed codes of a (rows, cols) weight, any byte valid, and positive absmax values in ``dtype``.

    absmax is drawn in the cell's dtype (so the reference's float64 run is the
    oracle); every value is exactly representable in float32 too.
    """
    rows, cols = shape
    packed = torch.randint(0, 256, (rows, cols // 2), generator=generator, dtype=torch.uint8)
    blocks = -(-rows * cols // BLOCKSIZE)
    absmax = (0.05 + 3.0 * torch.rand(blocks, generator=generator)).to(dtype)
    return SampleInput(args=(packed.to(device), absmax.to(device)), layout_args=(0,), grad_args=())
