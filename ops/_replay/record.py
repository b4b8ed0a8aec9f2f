"""Recording an op's Triton launches into a replay plan (the format ``replay.cpp`` parses).

While :class:`Recorder` is active on a thread, every ``JITFunction.run`` on that
thread (i.e. every ``kernel[grid](...)`` launch, whoever wrote the launcher) is
seen: the kernel, its grid and arguments, and the specialization Triton's own
binder gives them, so the plan launches exactly the binary Triton's JIT
launches.  Each kernel parameter becomes one of

* an input's pointer (+ byte offset, for a view of an input),
* a buffer's pointer + byte offset (a tensor the launcher allocated),
* a literal: every int and float the launcher passes is a function of the key
  the C++ side looked the plan up by (dtypes, sizes, strides, alignment,
  scalar arguments),
* a null pointer (Triton's trailing scratch parameters, unused by these kernels).

The parameter list is checked against the ``.entry`` of the kernel's PTX
(count and width of every parameter), so a Triton version that adds or
reorders parameters makes the recorder refuse rather than misplace one.
Anything the plan cannot express (a torch op writing a buffer, an output that
aliases an input, scratch memory, clusters, tuples) refuses the plan with a
reason; that key then stays on the Python path.

``live`` recording (GPU) lets each launch run and takes the kernel Triton
compiled; ``offline`` recording (tests, no GPU) skips the launch and
cross-compiles for a CUDA target instead, so plans and parameter blocks are
verified on a machine without a GPU.
"""

from __future__ import annotations

import re
import struct
import threading
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

PLAN_VERSION = 1
INPUT_PTR, BUFFER_PTR, LITERAL, NULL_PTR = 0, 1, 2, 3
#: c10::ScalarType codes (a stable ABI of c10).
SCALAR_TYPE = {
    torch.uint8: 0, torch.int8: 1, torch.int16: 2, torch.int32: 3, torch.int64: 4, torch.float16: 5,
    torch.float32: 6, torch.float64: 7, torch.bool: 11, torch.bfloat16: 15,
}  # fmt: skip
_WIDTH = {"1": 1, "8": 1, "16": 2, "32": 4, "64": 8}
#: aten ops a launcher may run while recording: allocations and views, never a write.
ALLOWED_ATEN = frozenset(
    [
        "empty",
        "empty_strided",
        "new_empty",
        "new_empty_strided",
        "empty_like",
        "view",
        "_unsafe_view",
        "select",
        "slice",
        "alias",
        "as_strided",
        "t",
        "transpose",
        "permute",
        "unsqueeze",
        "squeeze",
        "expand",
        "detach",
        "lift_fresh",
    ]
)
_TLS = threading.local()
_PATCH_LOCK = threading.Lock()


class Refused(Exception):
    """The plan cannot express what the launcher did; the reason says what."""


def param_width(ty: str) -> int:
    """Bytes of a Triton signature type as a kernel parameter (pointers are 8)."""
    if ty.startswith("*"):
        return 8
    if ty in ("i1", "u1", "i8", "u8"):
        return 1
    if ty in ("i16", "u16", "fp16", "bf16"):
        return 2
    if ty in ("i32", "u32", "fp32"):
        return 4
    if ty in ("i64", "u64", "fp64"):
        return 8
    raise Refused(f"kernel parameter type {ty} is not supported by replay")


def ptx_param_widths(ptx: str, name: str) -> list[int]:
    """Byte widths of the parameters of ``.entry name`` in ``ptx``."""
    m = re.search(r"\.entry\s+" + re.escape(name) + r"\s*\((.*?)\)", ptx, re.DOTALL)
    if m is None:
        raise Refused(f"no .entry {name} in the kernel's PTX")
    widths = []
    for decl in re.findall(r"\.param\s+([^,]+?)\s+\S+_param_\d+", m.group(1)):
        kind = re.search(r"\.[busf](\d+)", decl)
        if kind is None:
            raise Refused(f"unparsed PTX parameter {decl!r} of {name}")
        widths.append(8 if ".ptr" in decl else _WIDTH[kind.group(1)])
    return widths


@dataclass
class LaunchRecord:
    function: int
    grid: tuple[int, int, int]
    threads: int
    shared: int
    #: (kind, size, a, b) per kernel parameter
    params: list[tuple[int, int, int, int]]
    name: str = ""


@dataclass
class Recorder:
    """Active on the current thread within ``with``; ``plan(outputs)`` encodes what it saw."""

    inputs: Sequence[Any]
    offline_target: Any = None  # a triton GPUTarget: offline recording for that device
    launches: list[LaunchRecord] = field(default_factory=list)
    refused: str | None = None
    _storages: dict[int | tuple[str, int], tuple[int, torch.Tensor]] = field(default_factory=dict)
    _compiled: dict[Any, Any] = field(default_factory=dict)
    _guard: _NoWrites | None = field(default=None, repr=False)

    def __enter__(self) -> Recorder:
        _install_patch()
        if getattr(_TLS, "recorder", None) is not None:
            raise RuntimeError("a replay recording is already active on this thread")
        _TLS.recorder = self
        self._guard = _NoWrites(self)
        self._guard.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        guard, self._guard = self._guard, None  # it points back here: no cycle outliving the call
        if guard is not None:
            guard.__exit__(*exc)
        _TLS.recorder = None

    def release(self) -> None:
        """Drop the call's tensors (inputs, outputs, buffers): the plan is made, nothing else needs them.

        A recording that kept them alive kept their memory allocated after the
        call.  Under CUDA graph trees that memory is the graph pool's, and torch
        checks that every live allocation in the pool is a tracked output
        ("Detected N tensor(s) in the cudagraph pool not tracked as outputs").
        """
        self.inputs = ()
        self._storages.clear()
        self._compiled.clear()

    def refuse(self, reason: str) -> None:
        if self.refused is None:
            self.refused = reason

    # -- launches
    def launch(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], grid: Any, run: Any) -> Any:
        kernel = None
        if self.offline_target is None:
            kernel = run(fn, *args, grid=grid, warmup=False, **kwargs)
        if self.refused is not None:
            return kernel
        try:
            self.launches.append(self._record(fn, args, kwargs, grid, kernel))
        except Refused as exc:
            self.refuse(str(exc))
        except Exception as exc:  # noqa: BLE001 - e.g. another Triton's internals: the op's result stands
            self.refuse(f"recorder: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}")
        return kernel

    def _binder(self, fn: Any) -> tuple[Any, Any]:
        if self.offline_target is None:
            from triton.runtime.driver import driver

            device = driver.active.get_current_device()
            *_, backend, binder = fn.device_caches[device]  # the JIT's own (its last two entries)
            return backend, binder
        from triton.compiler import make_backend
        from triton.runtime.jit import create_function_from_signature

        backend = make_backend(self.offline_target)
        return backend, create_function_from_signature(fn.signature, fn.params, backend)

    def _offline_compile(
        self, fn: Any, backend: Any, kwargs: Any, bound: Any, spec: Any, *, options: Any
    ) -> Any:
        import triton
        from triton.compiler import ASTSource

        key = (fn, repr(spec), repr(sorted(kwargs.items(), key=str)))
        if key not in self._compiled:
            opts, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, spec, options)
            src = ASTSource(fn, signature, constexprs, attrs)
            self._compiled[key] = triton.compile(src, target=self.offline_target, options=opts.__dict__)
        return self._compiled[key]

    def _record(
        self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], grid: Any, kernel: Any
    ) -> LaunchRecord:
        backend, binder = self._binder(fn)
        bound, spec, options = binder(*args, **kwargs)
        if kernel is None:
            kernel = self._offline_compile(fn, backend, kwargs, bound, spec, options=options)
        md = kernel.metadata
        for attr in ("global_scratch_size", "profile_scratch_size"):
            if int(getattr(md, attr, 0) or 0) > 0:
                raise Refused(f"{md.name} needs {attr.replace('_', ' ')}; replay passes none")
        if int(getattr(md, "num_ctas", 1)) != 1 or getattr(md, "launch_cooperative_grid", False):
            raise Refused(f"{md.name}: clusters / cooperative launches are not replayed")
        if getattr(md, "launch_pdl", False) or int(md.shared) > 48 * 1024:
            raise Refused(f"{md.name}: PDL or > 48 KiB shared memory needs launch attributes")
        if callable(grid):
            grid = grid(bound)
        g = tuple(int(v) for v in grid) + (1,) * (3 - len(grid))
        params = []
        for value, (ty, _attr) in zip(bound.values(), spec, strict=True):
            if ty == "constexpr":
                continue
            if isinstance(ty, tuple) or isinstance(value, tuple):
                raise Refused(f"{md.name}: tuple arguments are not replayed")
            params.append(self._param(ty, value))
        widths = ptx_param_widths(kernel.asm["ptx"], md.name)
        extra = len(widths) - len(params)
        if (
            extra not in (0, 1, 2)
            or [p[1] for p in params] != widths[: len(params)]
            or any(w != 8 for w in widths[len(params) :])
        ):
            raise Refused(
                f"{md.name}: recorded parameters {[p[1] for p in params]} do not match the PTX entry {widths}"
            )
        params += [(NULL_PTR, 8, 0, 0)] * extra  # Triton's global / profile scratch pointers
        function = 0
        if self.offline_target is None:
            kernel._init_handles()
            function = int(kernel.function)
        return LaunchRecord(function, g, 32 * int(md.num_warps), int(md.shared), params, md.name)  # type: ignore[arg-type]

    def _param(self, ty: str, value: Any) -> tuple[int, int, int, int]:
        width = param_width(ty)
        if ty.startswith("*"):
            if not isinstance(value, torch.Tensor):
                raise Refused(f"pointer parameter of type {ty} got {type(value).__name__}")
            return self._pointer(value)
        if ty.startswith("fp"):
            fmt = {4: "<f", 8: "<d"}.get(width)
            if fmt is None:
                raise Refused(f"{ty} scalar parameters are not replayed")
            bits = int.from_bytes(struct.pack(fmt, float(value)), "little")
            return (LITERAL, width, 0, _signed(bits))
        return (LITERAL, width, 0, _signed(int(value) & ((1 << (8 * width)) - 1)))

    def _pointer(self, t: torch.Tensor) -> tuple[int, int, int, int]:
        for i, a in enumerate(self.inputs):
            if isinstance(a, torch.Tensor) and a is t:
                return (INPUT_PTR, 8, i, 0)
        base = t.untyped_storage().data_ptr()
        for i, a in enumerate(self.inputs):
            if isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr() == base:
                return (INPUT_PTR, 8, i, t.data_ptr() - a.data_ptr())
        return (BUFFER_PTR, 8, self._buffer(t), t.data_ptr() - base)

    def _buffer(self, t: torch.Tensor) -> int:
        """The plan's buffer for ``t``'s storage, one per distinct allocation.

        Storages are told apart by address, except those of no memory: every
        empty storage has address 0, and two empty outputs sharing one buffer
        would come back from a replay as views of one storage (aliases).
        """
        storage = t.untyped_storage()
        key: int | tuple[str, int] = storage.data_ptr()
        if key == 0:
            key = ("empty", storage._cdata)  # the storage itself, whichever tensor views it
        if key not in self._storages:
            self._storages[key] = (len(self._storages), t)
        return self._storages[key][0]

    # -- the plan
    def plan(self, outputs: Sequence[torch.Tensor]) -> bytes | None:
        """The encoded plan, or None (``refused`` says why)."""
        if self.refused is None:
            try:
                return self._encode(outputs)
            except Refused as exc:
                self.refuse(str(exc))
            except Exception as exc:  # noqa: BLE001 - never fail the call that was recorded
                self.refuse(f"plan: {type(exc).__name__}: {exc}")
        return None

    def _encode(self, outputs: Sequence[torch.Tensor]) -> bytes:
        input_storages = {
            a.untyped_storage().data_ptr() for a in self.inputs if isinstance(a, torch.Tensor) and a.numel()
        }
        out_words: list[int] = []
        direct: dict[int, int] = {}
        written = {p[2] for la in self.launches for p in la.params if p[0] == BUFFER_PTR}
        for k, o in enumerate(outputs):
            if not isinstance(o, torch.Tensor) or o.dtype not in SCALAR_TYPE:
                raise Refused(f"output {k} is not a tensor of a replayable dtype")
            if o.numel() and o.untyped_storage().data_ptr() in input_storages:
                raise Refused(f"output {k} aliases an input")
            b = self._buffer(o)
            if o.numel() and b not in written:
                raise Refused(
                    f"output {k} is written by no recorded launch (a kernel this recorder cannot see)"
                )
            nbytes = o.untyped_storage().nbytes()
            covers = o.storage_offset() == 0 and o.numel() * o.element_size() == nbytes and _dense(o)
            if covers and b not in direct:
                direct[b] = k
            out_words += [b, SCALAR_TYPE[o.dtype], o.dim(), int(o.storage_offset()), *o.shape, *o.stride()]
        words = [PLAN_VERSION, len(self._storages), len(self.launches), len(outputs)]
        for _key, (b, t) in sorted(self._storages.items(), key=lambda kv: kv[1][0]):
            words += [t.untyped_storage().nbytes(), direct.get(b, -1)]
        for la in self.launches:
            words += [la.function, *la.grid, la.threads, la.shared, len(la.params)]
            for p in la.params:
                words += list(p)
        words += out_words
        return array("q", words).tobytes()


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _dense(t: torch.Tensor) -> bool:
    """Non-overlapping and dense: the strides are a permutation of a contiguous layout."""
    dims = sorted((s, n) for s, n in zip(t.stride(), t.shape, strict=True) if n != 1)
    expected = 1
    for stride, size in dims:
        if stride != expected:
            return False
        expected *= size
    return True


class _NoWrites(TorchDispatchMode):
    """Refuses the plan when the launcher runs a torch op other than an allocation or a view."""

    def __init__(self, rec: Recorder) -> None:
        TorchDispatchMode.__init__(self)  # not super(): mypy reads that as an untyped call
        self.rec = rec

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func._schema.name.split("::")[-1]
        if name not in ALLOWED_ATEN:
            self.rec.refuse(f"the launcher ran aten::{name} (replay allocates buffers uninitialised)")
        return func(*args, **(kwargs or {}))


def _install_patch() -> None:
    """Route ``JITFunction.run`` through the thread's recorder (a no-op for threads not recording)."""
    from triton.runtime.jit import JITFunction

    with _PATCH_LOCK:
        if getattr(JITFunction.run, "_opgate_replay", False):
            return
        original = JITFunction.run

        def run(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
            rec = getattr(_TLS, "recorder", None)
            if rec is None or warmup:
                return original(self, *args, grid=grid, warmup=warmup, **kwargs)
            return rec.launch(self, args, kwargs, grid, original)

        run._opgate_replay = True  # type: ignore[attr-defined]
        JITFunction.run = run
