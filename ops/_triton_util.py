"""Shared plumbing for opgate's Triton ops: stride-aware row addressing and launch heuristics.

Why this exists: every row-wise op (norms, SwiGLU) must read tensors in whatever
layout the caller hands over — transposed, sliced, offset, broadcast — without a
hidden ``.contiguous()``.  Instead of copying, the leading dimensions of all the
tensors an op touches are *jointly* collapsed into at most three (size, stride)
pairs, and the kernel turns a flat row index back into a memory offset with
:func:`ops._triton_device.row_offset`.  The common contiguous case collapses to one leading
dimension and pays no integer division at all (``NLEAD`` is a constexpr).

Launch parameters are chosen by heuristic, never by autotuning: autotuning under
``TRITON_INTERPRET=1`` (the CPU path) would run every candidate config in numpy.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import triton.language as tl

#: At most this many leading (row) dimensions survive collapsing; 4-d inputs always fit.
MAX_LEAD = 3
#: Widest row kept whole in registers by the forward kernels (elements).
MAX_FUSED_FWD = 16384
#: Widest row kept whole in registers by the backward kernels (they hold x, dy, w and dw).
MAX_FUSED_BWD = 8192
#: Column chunk used by the looped (wide-row) variants.
CHUNK = 4096
#: Dtypes the kernels accept; float64 accumulates in float64 so gradcheck can run on the op itself.
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@functools.cache
def interpreting() -> bool:
    """True when Triton runs kernels in its numpy interpreter (CPU tensors).

    Read once, like Triton itself, which decides at ``@triton.jit`` time.
    """
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def next_pow2(n: int) -> int:
    """Pure Python (``triton.next_power_of_2`` costs microseconds per launch on the host)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def check(cond: object, message: Callable[[], str]) -> None:
    """``torch._check`` semantics with a fast path for plain bools.

    Real tensors give plain bools (the eager path, where host overhead is what
    small shapes are timed on); fake tensors may give SymBools, which go to
    ``torch._check`` so that symbolic shapes get guards or runtime asserts.
    """
    if cond is True:
        return
    if cond is False:
        raise RuntimeError(message())
    torch._check(cond, message)


def acc_dtype(*dtypes: torch.dtype) -> tl.dtype:
    """Accumulation type: float32, or float64 when any input is float64."""
    return tl.float64 if torch.float64 in dtypes else tl.float32


@functools.lru_cache(maxsize=16)
def _sm_count(device_index: int) -> int:
    return int(torch.cuda.get_device_properties(device_index).multi_processor_count)


#: Knobs of the persistent backward kernels: programs per SM, software prefetch of the
#: next row block, and a num_warps override (None: by tile size).  Defaults come from
#: an H200 sweep of these three knobs (``opgate perf bench`` times one setting per run).
BWD_TUNING: dict[str, int | bool | None] = {"programs_per_sm": 2, "prefetch": True, "warps": None}


def bwd_warps(tile: RowTile) -> int:
    override = BWD_TUNING["warps"]
    return int(override) if override else tile.num_warps


def persistent_programs(device: torch.device, work_items: int) -> int:
    """How many programs a persistent (grid-stride) kernel should launch.

    GPU: a few waves over the SMs so every SM keeps loads in flight.  Interpreter:
    a handful, since each program is simulated one after another and the dw
    partial buffer grows with the count.
    """
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        target = int(BWD_TUNING["programs_per_sm"] or 1) * _sm_count(index)
    else:
        target = 4
    return max(1, min(work_items, target))


@dataclass(frozen=True)
class RowTile:
    """Launch shape of a row-wise kernel: ``BLOCK_M`` rows x ``BLOCK_N`` columns per program.

    ``chunked``: the row is too wide for registers and is walked in ``BLOCK_N``
    chunks (one row per program).
    """

    BLOCK_M: int
    BLOCK_N: int
    num_warps: int
    chunked: bool

    @property
    def elements(self) -> int:
        return self.BLOCK_M * self.BLOCK_N


def _warps_for(tile_elements: int, itemsize: int) -> int:
    """One 16-byte vector per thread per pass, at most 16 warps (512 threads)."""
    vec = max(1, 16 // itemsize)
    return max(1, min(16, next_pow2(tile_elements // (32 * vec * 2))))


@functools.lru_cache(maxsize=1024)
def row_tile(n_rows: int, n_cols: int, itemsize: int, max_fused: int) -> RowTile:
    """Heuristic tiling for a row-wise reduction over ``n_cols``.

    GPU: one row per program up to ~2k columns of work, several rows for narrow
    rows (so each program still moves a few KiB), a chunked loop past
    ``max_fused``.  Interpreter: tiles of up to 32k elements so that few programs
    are simulated.
    """
    block_n = next_pow2(n_cols)
    chunked = block_n > max_fused
    if chunked:
        return RowTile(1, CHUNK, _warps_for(CHUNK, itemsize), True)
    target = 32768 if interpreting() else 2048
    block_m = max(1, min(target // block_n, 64, next_pow2(n_rows)))
    return RowTile(block_m, block_n, _warps_for(block_m * block_n, itemsize), False)


@dataclass(frozen=True)
class Rows:
    """Leading dimensions of several same-shaped tensors, jointly collapsed.

    ``sizes`` = (R1, R2): inner sizes for decoding a flat row index;
    ``strides[i]`` = (s0, s1, s2) of tensor ``i`` (zeros for unused slots);
    ``nlead`` in 1..3 selects the decode in :func:`ops._triton_device.row_offset`.
    """

    n_rows: int
    nlead: int
    sizes: tuple[int, int]
    strides: tuple[tuple[int, int, int], ...]

    def args(self, i: int) -> tuple[int, int, int]:
        return self.strides[i]


def collapse_rows(op: str, shape: Sequence[int], tensors: Sequence[torch.Tensor], n_trail: int = 1) -> Rows:
    """Cached front of :func:`_collapse` (the plan depends only on shape and strides)."""
    return _collapse(op, tuple(shape), tuple(t.stride() for t in tensors), n_trail)


@functools.lru_cache(maxsize=1024)
def _collapse(
    op: str, shape: tuple[int, ...], all_strides: tuple[tuple[int, ...], ...], n_trail: int
) -> Rows:
    """Merge leading dims of ``shape`` wherever *every* tensor's strides allow it.

    ``all_strides``: one stride tuple per tensor of ``shape`` (any strides, stride 0 included).
    Raises ``ValueError`` naming ``op`` when more than :data:`MAX_LEAD`
    unmergeable leading dims remain (only possible for 5-d+ inputs with
    scrambled strides); nothing is ever copied.
    """
    lead = list(shape[: len(shape) - n_trail])
    dims: list[tuple[int, list[int]]] = []
    for i, size in enumerate(lead):
        if size == 1:
            continue
        strides = [st[i] for st in all_strides]
        if dims and all(p == c * size for p, c in zip(dims[-1][1], strides, strict=True)):
            dims[-1] = (dims[-1][0] * size, strides)
        else:
            dims.append((size, strides))
    if not dims:
        dims = [(1, [0] * len(all_strides))]
    if len(dims) > MAX_LEAD:
        raise ValueError(
            f"{op}: the leading dims of shape {tuple(shape)} with strides "
            f"{list(all_strides)} collapse to {len(dims)} dims; at most "
            f"{MAX_LEAD} are supported (no copy is made: pass a view with mergeable leading dims)"
        )
    n_rows = 1
    for size, _ in dims:
        n_rows *= size
    sizes = [d[0] for d in dims[1:]] + [1] * (MAX_LEAD - len(dims))
    per_tensor = tuple(
        tuple([d[1][k] for d in dims] + [0] * (MAX_LEAD - len(dims))) for k in range(len(all_strides))
    )
    return Rows(n_rows, len(dims), (sizes[0], sizes[1]), per_tensor)  # type: ignore[arg-type]


def check_float(op: str, name: str, t: torch.Tensor) -> None:
    """A clear error for dtypes the kernels do not handle (works on fake tensors too)."""
    check(
        t.dtype in FLOAT_DTYPES,
        lambda: f"{op}: {name} must be float16, bfloat16, float32 or float64, got {t.dtype}",
    )


def check_same_device(op: str, tensors: dict[str, torch.Tensor]) -> None:
    first = next(iter(tensors.values())).device
    check(
        all(t.device == first for t in tensors.values()),
        lambda: (
            f"{op}: all tensors must be on one device, got "
            + ", ".join(f"{k}={v.device}" for k, v in tensors.items())
        ),
    )


def partial_dtype(*outputs: torch.dtype) -> torch.dtype:
    """Accumulator of the dw/db partial sums: float64 when a weight gradient is float32/64.

    Why: a float32 dw sums thousands of float32 products; accumulated in float32
    its error is a few ulp of |dw| and lands right at the tolerance rule's edge
    (seen on the H200), while float64 accumulation leaves only the final
    rounding.  The extra FLOPs are free in these memory-bound kernels.
    """
    wide = any(d in (torch.float32, torch.float64) for d in outputs)
    return torch.float64 if wide else torch.float32


def needs_rne(*outputs: torch.Tensor) -> bool:
    """True when bfloat16 stores must be rounded by hand (see :func:`ops._triton_device.round_to`)."""
    return interpreting() and any(t.dtype == torch.bfloat16 for t in outputs)


def build_signature(
    kernel: object,
    constexprs: dict[str, object],
    *,
    pointers: dict[str, str] | None = None,
    num_warps: int = 4,
) -> dict[str, object]:
    """One ``TRITON_BUILD_SIGNATURES`` entry for the build check's ahead-of-time compile.

    Derived from the kernel's parameters so it cannot drift from the code:
    ``*_ptr`` parameters are ``*{dtype}`` (or the type named in ``pointers``),
    ``eps`` is fp32, every other runtime argument i32; ``constexprs`` binds the
    compile-time ones to a representative configuration.
    """
    fn = getattr(kernel, "fn", kernel)
    pointers = pointers or {}
    signature: dict[str, str] = {}
    for name, param in inspect.signature(fn).parameters.items():  # type: ignore[arg-type]
        if "constexpr" in str(param.annotation):
            continue
        if name.endswith("_ptr"):
            signature[name] = "*" + pointers.get(name, "{dtype}")
        else:
            signature[name] = "fp32" if name == "eps" else "i32"
    return {"signature": signature, "constexprs": dict(constexprs), "options": {"num_warps": num_warps}}
