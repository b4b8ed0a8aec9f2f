"""What really ran: one profiled call, read back from the profiler's Chrome trace.

Why the Chrome trace rather than ``prof.events()``: only the trace carries each
op's input *types* (``record_shapes``), which is what tells a layout copy
(``aten::copy_`` bf16 <- bf16, a hidden ``.contiguous()``) from a cast
(``aten::copy_`` float <- bf16, which a reference legitimately does), and it
links every GPU kernel to the CPU op that launched it (``External id``), so a
counted copy can be listed with its kernel.  The same file is kept in the cell's
work directory as evidence.

Event names: on CPU the dispatcher's op events (``opgate::rms_norm``,
``aten::copy_``) and ``record_function`` annotations; on CUDA the device
kernels (``_rms_norm_fwd_kernel``, ``triton_red_fused_...``).
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

#: Chrome-trace categories holding host-side events (op dispatches, annotations, Inductor kernel records).
HOST_CATEGORIES = frozenset({"cpu_op", "user_annotation"})
#: Categories holding device kernels.
KERNEL_CATEGORIES = frozenset({"kernel"})
#: ``Input type`` of untyped-storage copies.  Triton's CPU interpreter moves every kernel argument
#: through ``UntypedStorage.copy_`` (byte tensors); those are simulator plumbing, not the op's copies.
STORAGE_COPY_TYPES = frozenset({"unsigned char"})
#: Inductor names a generated kernel after the aten ops it fuses; a layout copy is a ``clone``.
INDUCTOR_COPY_PATTERNS = ("*fused*clone*",)


@dataclass(frozen=True)
class Event:
    name: str
    category: str
    input_types: tuple[str, ...] = ()
    input_dims: tuple[Any, ...] = ()
    external_id: int | None = None


@dataclass
class Trace:
    """Events of one profiled call; ``path`` is the Chrome trace written for it."""

    host: list[Event] = field(default_factory=list)
    kernels: list[Event] = field(default_factory=list)
    path: Path | None = None

    def names(self, device_kind: str) -> list[str]:
        """Distinct names evidence patterns are matched against, in first-seen order."""
        events = self.kernels if device_kind == "cuda" else self.host
        return list(dict.fromkeys(e.name for e in events))

    @property
    def empty(self) -> bool:
        return not self.host and not self.kernels

    def copies(self) -> list[str]:
        """Layout copies, one line each: same-dtype ``aten::copy_`` and Inductor ``clone`` kernels.

        Casts (dtype-changing copies) are not counted: a reference that upcasts
        to float32 needs them, and an op that fuses the cast into its kernel
        must not be charged for the reference's choice.
        """
        launched: dict[int, list[str]] = {}
        for k in self.kernels:
            if k.external_id is not None:
                launched.setdefault(k.external_id, []).append(k.name)
        found = []
        for e in self.host:
            if not _is_layout_copy(e):
                continue
            line = e.name
            if e.name == "aten::copy_" and len(e.input_dims) >= 2:
                dst, src = (list(d) if isinstance(d, (list, tuple)) else d for d in e.input_dims[:2])
                line += f" {e.input_types[0]}{dst} <- {e.input_types[1]}{src}"
            kernels = launched.get(e.external_id, []) if e.external_id is not None else []
            found.append(line + (f" [{', '.join(kernels)}]" if kernels else ""))
        return found


def _is_layout_copy(e: Event) -> bool:
    if any(fnmatch.fnmatchcase(e.name, p) for p in INDUCTOR_COPY_PATTERNS):
        return True
    if e.name != "aten::copy_" or len(e.input_types) < 2:
        return False
    dst, src = e.input_types[0], e.input_types[1]
    return dst == src and dst not in STORAGE_COPY_TYPES


def parse_chrome_trace(path: Path) -> Trace:
    """Read the complete ("X") events of a Chrome trace written by ``export_chrome_trace``."""
    data = json.loads(path.read_text())
    raw = data.get("traceEvents", []) if isinstance(data, dict) else data
    trace = Trace(path=path)
    for ev in raw:
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        cat, args = str(ev.get("cat", "")), ev.get("args") or {}
        ext = args.get("External id")
        event = Event(
            name=str(ev.get("name", "")),
            category=cat,
            input_types=tuple(str(t) for t in args.get("Input type", ()) or ()),
            input_dims=tuple(args.get("Input Dims", ()) or ()),
            external_id=int(ext) if isinstance(ext, int) else None,
        )
        if cat in HOST_CATEGORIES:
            trace.host.append(event)
        elif cat in KERNEL_CATEGORIES:
            trace.kernels.append(event)
    return trace


def profile_call(fn: Callable[[], Any], device_kind: str, path: Path) -> tuple[Trace, Any]:
    """Profile one call of ``fn`` (warm it up first: compile and autotune must not be in the trace)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device_kind == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities, record_shapes=True) as prof:
        out = fn()
        if device_kind == "cuda":
            torch.cuda.synchronize()
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))
    return parse_chrome_trace(path), out


def matches(name: str, pattern: str) -> bool:
    """Case-sensitive glob match; ``a|b`` matches when either alternative does (one kernel of several)."""
    return any(fnmatch.fnmatchcase(name, alt) for alt in pattern.split("|"))


def match(names: Iterable[str], patterns: Sequence[str]) -> dict[str, list[str]]:
    """For each pattern (see :func:`matches`), the names it matches."""
    names = list(names)
    return {p: [n for n in names if matches(n, p)] for p in patterns}


def _own_function(fn: Any) -> Any:
    """The user's function behind a ``torch.library.triton_op`` op.

    ``triton_op`` registers one closure (``backend_fn``) per op, all sharing a
    code object, around the user's body (its free variable ``fn``): the body's
    code is what identifies the op.
    """
    code = getattr(fn, "__code__", None)
    if code is not None and code.co_name == "backend_fn" and "fn" in code.co_freevars and fn.__closure__:
        inner = fn.__closure__[code.co_freevars.index("fn")].cell_contents
        if hasattr(inner, "__code__"):
            return inner
    return fn


def executed_custom_ops(fn: Callable[[], Any], qualnames: Sequence[str]) -> list[str]:
    """Which of ``qualnames`` (``torch.library.custom_op`` ops) had their own Python body run in ``fn``.

    The CPU witness beside the profiler, where a Triton kernel under the
    interpreter leaves no kernel event and torch 2.14 records no dispatcher event
    for a custom op whose arguments are all tensors (measured: ``t::two(Tensor,
    Tensor)`` leaves none, ``t::twof(Tensor, Tensor, float)`` does).  A dispatch
    mode would make Dynamo skip its compiled frames; a profile hook
    (``sys.setprofile``) does not, and it
    sees the custom op's own implementation function (``_init_fn``) execute
    inside the compiled program.  An op that
    was decomposed or replaced never runs its body, so it is never reported.
    """
    import sys

    from torch._library.custom_ops import OPDEFS

    codes: dict[Any, str] = {}
    for name in qualnames:
        opdef = OPDEFS.get(name)
        if opdef is None:
            continue
        # Only the op's own function: register_kernel wrappers share one code object across ops.
        code = getattr(_own_function(opdef._init_fn), "__code__", None)
        if code is not None:
            codes[code] = name
    ran: dict[str, None] = {}

    def hook(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code in codes:
            ran.setdefault(codes[frame.f_code], None)

    previous = sys.getprofile()
    sys.setprofile(hook)
    try:
        fn()
    finally:
        sys.setprofile(previous)
    return list(ran)
