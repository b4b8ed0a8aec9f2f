"""Everything a check needs about one cell, resolved once.

The context imports the implementation (which registers its torch.library
op), resolves the op, reference and sample-input callables named in the spec,
and hands out inputs.  Every request gets inputs of its own, never shared: a
check (or an op that wrongly mutates its inputs) can never disturb the inputs
another check sees, and every number in a result can be reproduced from the
recorded seed alone.  The sample function runs once per (dtype, shapes) and
cell; each request gets a deep copy of what it drew, made on the device, with
strides, storage offsets and the sharing of one storage between tensors kept
as drawn.  Drawing on the CPU and uploading for every request took rope's
sample function 0.45-0.74 s of four cells' checks on the GPU
(``results/runs/h100-speed-warm-2``); the copies do not show in the same
profile (``results/runs/h200-speed-warm-10``).  Samples that cannot be
deep-copied (a non-leaf tensor) or are too large to keep are drawn again.

In the modes that run the op inside a small graph (compile, cudagraphs,
export: :mod:`validators.checks.opgraph`), ``reference`` is the spec's
reference run through the same producer and consumer, so every comparison
sets like against like.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from opgate.ops.base import DTYPES, SampleInput
from opgate.validators.checks.opgraph import GRAPH_MODES, run_eagerly
from opgate.validators.layouts import LayoutError, apply_layout, zero_size_variants
from opgate.validators.perf.timing import input_bytes
from opgate.validators.tolerance import Rule

if TYPE_CHECKING:
    from opgate.matrix.cell import Cell
    from opgate.matrix.spec import ImplSpec, OpSpec
    from opgate.validators.checks.artifacts import Artifact

#: Odd multiplier that spreads (seed, stream) pairs over the generator's 63-bit seed space.
_STREAM_MIX = 0x9E3779B97F4A7C15

#: Drawn samples up to this many bytes (all storages of one request) are kept for copying;
#: larger ones (benchmark shapes) are drawn again, so a cell never holds a second big copy.
KEEP_BYTES = 256 << 20

_SampleKey = tuple[torch.dtype, tuple[tuple[int, ...], ...]]


def call(fn: Callable[..., Any], sample: SampleInput) -> Any:
    return fn(*sample.args, **sample.kwargs)


def upcast(sample: SampleInput, dtype: torch.dtype = torch.float64) -> SampleInput:
    """Detached copies of every floating tensor argument in ``dtype`` (the oracle's inputs)."""

    def conv(a: Any) -> Any:
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            return a.detach().to(dtype)
        return a

    return dataclasses.replace(
        sample,
        args=tuple(conv(a) for a in sample.args),
        kwargs={k: conv(v) for k, v in sample.kwargs.items()},
    )


def with_grad(sample: SampleInput) -> SampleInput:
    """The sample with ``requires_grad`` on its floating ``grad_args`` (leaf views keep their strides)."""
    args = list(sample.args)
    for i in sample.differentiable():
        a = args[i]
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            args[i] = a.detach().requires_grad_(True)
    return dataclasses.replace(sample, args=tuple(args))


@dataclass
class CellContext:
    """One cell, resolved: callables, tolerance rule, inputs on demand, the mode's artifact."""

    cell: Cell
    spec: OpSpec
    impl: ImplSpec
    device: str
    seed: int
    workdir: Path
    op: Callable[..., Any]
    reference: Callable[..., Any]
    sample_fn: Callable[..., SampleInput]
    dtype: torch.dtype
    shapes: list[tuple[int, ...]]
    rule: Rule
    copies_allowed: int
    artifact: Artifact | None = None
    #: Names seen by the evidence check (what the outcome reports as ``kernels``).
    kernels: list[str] = field(default_factory=list)
    _zero: tuple[int, ...] | None = field(default=None, repr=False)
    #: Samples as drawn, per (dtype, shapes), never handed out (None: draw again on every request).
    _drawn: dict[_SampleKey, list[SampleInput] | None] = field(default_factory=dict, init=False, repr=False)

    @property
    def device_kind(self) -> str:
        return "cuda" if self.device.startswith("cuda") else "cpu"

    @property
    def mode(self) -> str:
        return self.cell.mode

    def generator(self, stream: int = 0) -> torch.Generator:
        """A CPU generator seeded from (seed, stream): stream 0 draws inputs, others e.g. upstream grads."""
        return torch.Generator().manual_seed((self.seed + _STREAM_MIX * stream) % (2**63))

    def samples(
        self, *, dtype: torch.dtype | None = None, shapes: list[tuple[int, ...]] | None = None
    ) -> list[SampleInput]:
        """Contiguous sample inputs of this request's own, one per shape, drawn from the cell's seed."""
        key: _SampleKey = (dtype or self.dtype, tuple(tuple(s) for s in shapes or self.shapes))
        if key in self._drawn:
            kept = self._drawn[key]
            if kept is not None:
                return copy.deepcopy(kept)
            return self._draw(key)
        drawn = self._draw(key)
        try:
            mine = copy.deepcopy(drawn)
            keep = input_bytes(drawn) <= KEEP_BYTES
        except Exception:  # noqa: BLE001 - a non-leaf tensor, a sparse or wrapper tensor without a storage
            self._drawn[key] = None
            return drawn
        self._drawn[key] = drawn if keep else None
        return mine

    def _draw(self, key: _SampleKey) -> list[SampleInput]:
        dtype, shapes = key
        gen = self.generator(0)
        return [self.sample_fn(shape, dtype, self.device, gen) for shape in shapes]

    def inputs(
        self,
        *,
        layout: str | None = None,
        dtype: torch.dtype | None = None,
        shapes: list[tuple[int, ...]] | None = None,
    ) -> list[SampleInput]:
        """Fresh inputs in the cell's layout (or ``layout``); same values on every call."""
        layout = layout or self.cell.layout
        samples = self.samples(dtype=dtype, shapes=shapes)
        targets = self._zero_targets(samples[0]) if layout == "zero_size" and samples else None
        return [apply_layout(s, layout, targets) for s in samples]

    def _zero_targets(self, sample: SampleInput) -> tuple[int, ...]:
        """The first :func:`zero_size_variants` entry the reference accepts (decided once per cell)."""
        if self._zero is None:
            tried = []
            for targets in zero_size_variants(sample):
                try:
                    with torch.no_grad():
                        call(self.reference, apply_layout(sample, "zero_size", targets))
                except Exception as exc:  # noqa: BLE001 - the reference decides which batch is empty
                    tried.append(f"args {list(targets)}: {type(exc).__name__}: {exc}")
                    continue
                self._zero = targets
                break
            else:
                raise LayoutError("the reference rejects every zero-size variant (" + "; ".join(tried) + ")")
        return self._zero


def _tolerance(cell: Cell, impl: ImplSpec) -> Rule:
    override = cell.override("tolerance") or {}
    if not isinstance(override, dict):
        raise ValueError(f"cell override 'tolerance' must be a mapping, got {override!r}")
    k = float(override.get("k", impl.tolerance.k))
    atol = float(override.get("atol_floor", impl.tolerance.atol_floor))
    return Rule(k=k, atol_floor=atol)


def build_context(cell: Cell, spec: OpSpec, device: str, seed: int, workdir: Path) -> CellContext:
    """Import the implementation and resolve the spec's callables for one cell."""
    from opgate.matrix.spec import resolve
    from opgate.validators.controls import CONTROL_IMPL, control_impl

    if cell.impl == CONTROL_IMPL:
        impl = control_impl(spec)  # an environment control runs the op's reference (validators.controls)
    elif cell.impl not in spec.implementations:
        known = ", ".join(sorted(spec.implementations))
        raise KeyError(f"{spec.path}: op {spec.op!r} has no implementation {cell.impl!r} (known: {known})")
    else:
        impl = spec.implementations[cell.impl]
    if cell.dtype not in DTYPES:
        raise KeyError(f"cell {cell.id}: unknown dtype {cell.dtype!r}")
    if cell.shapes not in spec.shapes:
        raise KeyError(f"{spec.path}: op {spec.op!r} has no shape set {cell.shapes!r}")
    if spec.root is not None and str(spec.root) not in sys.path:  # --ops-path specs: their folder
        sys.path.insert(0, str(spec.root))
    if impl.module:
        importlib.import_module(impl.module)
    copies = cell.override("copies_allowed", impl.copies_allowed)
    reference = resolve(spec.reference, spec.root)
    if cell.mode in GRAPH_MODES:
        reference = run_eagerly(reference)
    return CellContext(
        cell=cell,
        spec=spec,
        impl=impl,
        device=device,
        seed=seed,
        workdir=workdir,
        op=resolve(impl.entry, spec.root),
        reference=reference,
        sample_fn=resolve(spec.samples, spec.root),
        dtype=DTYPES[cell.dtype],
        shapes=[tuple(s) for s in spec.shapes[cell.shapes]],
        rule=_tolerance(cell, impl),
        copies_allowed=int(copies),
    )
