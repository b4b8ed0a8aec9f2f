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

Two more things the trace tells apart:

* opgate's own work inside a profiled call (the Triton CPU interpreter moving
  arguments through byte storages, the clones that keep CUDA-graph outputs
  alive): it runs inside a :func:`harness` range, and every event nested in
  one (and every kernel such an event launched) is left out of names and copies;
* the kernels a CUDA-graph replay ran (:meth:`Trace.graph_kernels`): CUPTI
  gives each of them the correlation id of the ``cudaGraphLaunch`` call, and
  newer kineto also writes a ``graph id``.  A replay has no host events for
  what the graph holds, so those kernels are the only evidence of it.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

#: Chrome-trace categories holding host-side events (op dispatches, annotations, Inductor kernel records).
HOST_CATEGORIES = frozenset({"cpu_op", "user_annotation"})
#: Categories holding device kernels; device-to-device memcpys are kept beside them (a graph may hold one).
KERNEL_CATEGORIES = frozenset({"kernel"})
MEMCPY_CATEGORIES = frozenset({"gpu_memcpy"})
#: Host-side CUDA API events (the launches that correlate kernels with their caller).
API_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver"})
#: API calls that replay a captured CUDA graph.
GRAPH_LAUNCHES = ("cudaGraphLaunch*", "cuGraphLaunch*")
#: Inductor names a generated kernel after the aten ops it fuses; a layout copy is a ``clone``.
INDUCTOR_COPY_PATTERNS = ("*fused*clone*",)
#: Name prefix of the ``record_function`` ranges opgate wraps around its own work (see :func:`harness`).
HARNESS_PREFIX = "opgate-harness::"


@dataclass(frozen=True)
class Event:
    name: str
    category: str
    input_types: tuple[str, ...] = ()
    input_dims: tuple[Any, ...] = ()
    external_id: int | None = None
    #: CUPTI correlation id (a kernel's is that of the API call that launched it, or of the graph launch).
    correlation: int | None = None
    #: kineto's ``graph id`` of a kernel replayed from a CUDA graph (absent in older kineto).
    graph_id: int | None = None
    ts: float = 0.0
    dur: float = 0.0
    thread: tuple[Any, Any] = (None, None)

    def encloses(self, other: Event) -> bool:
        return (
            self.thread == other.thread and self.ts <= other.ts and other.ts + other.dur <= self.ts + self.dur
        )


@dataclass
class Trace:
    """Events of one profiled call; ``path`` is the Chrome trace written for it.

    ``host`` and ``kernels`` hold only what the profiled code did: events opgate's
    harness caused are set aside in ``harness`` while parsing.
    """

    host: list[Event] = field(default_factory=list)
    kernels: list[Event] = field(default_factory=list)
    path: Path | None = None
    #: device-to-device and other GPU memcpys (kept apart: patterns never match them)
    memcpys: list[Event] = field(default_factory=list)
    #: correlation ids of the CUDA-graph launches in the call
    graph_launches: frozenset[int] = frozenset()
    #: events left out because opgate's harness caused them
    harness: list[Event] = field(default_factory=list)

    def names(self, device_kind: str) -> list[str]:
        """Distinct names evidence patterns are matched against, in first-seen order."""
        events = self.kernels if device_kind == "cuda" else self.host
        return list(dict.fromkeys(e.name for e in events))

    @property
    def empty(self) -> bool:
        return not self.host and not self.kernels and not self.harness

    def in_graph(self, event: Event) -> bool:
        """True for a kernel (or memcpy) a CUDA-graph replay ran."""
        return bool(event.graph_id) or (
            event.correlation is not None and event.correlation in self.graph_launches
        )

    def graph_kernels(self) -> list[Event]:
        """The kernels of every CUDA graph replayed in the call, in trace order."""
        return [k for k in self.kernels if self.in_graph(k)]

    def launched(self) -> dict[int, list[Event]]:
        """Device events (kernels, memcpys) by the ``External id`` of the host op that launched them."""
        found: dict[int, list[Event]] = {}
        for k in (*self.kernels, *self.memcpys):
            if k.external_id is not None:
                found.setdefault(k.external_id, []).append(k)
        return found

    def copies(self) -> list[str]:
        """Layout copies, one line each: same-dtype ``aten::copy_`` and Inductor ``clone`` kernels.

        Casts (dtype-changing copies) are not counted: a reference that upcasts
        to float32 needs them, and an op that fuses the cast into its kernel
        must not be charged for the reference's choice.  Copies of every dtype
        count, quantised ``uint8`` codes included; the Triton interpreter's byte
        copies are harness work and never reach this list.
        """
        launched = self.launched()
        found = []
        for e in self.host:
            if not _is_layout_copy(e):
                continue
            line = e.name
            if e.name == "aten::copy_" and len(e.input_dims) >= 2:
                dst, src = (list(d) if isinstance(d, (list, tuple)) else d for d in e.input_dims[:2])
                line += f" {e.input_types[0]}{dst} <- {e.input_types[1]}{src}"
            kernels = [k.name for k in launched.get(e.external_id, [])] if e.external_id is not None else []
            found.append(line + (f" [{', '.join(kernels)}]" if kernels else ""))
        return found

    def copy_kernel_names(self) -> frozenset[str]:
        """Names of the device work (kernels, memcpys) this call's layout copies launched.

        A CUDA-graph replay has no host events to type its copies with; the
        same op run eagerly does, and its copy kernels carry the same names
        inside the graph (see :func:`graph_copies`).
        """
        launched = self.launched()
        names = {
            k.name
            for e in self.host
            if _is_layout_copy(e) and e.external_id is not None
            for k in launched.get(e.external_id, [])
        }
        names |= {k.name for k in self.kernels if _is_inductor_copy(k.name)}
        return frozenset(names)


def _is_inductor_copy(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in INDUCTOR_COPY_PATTERNS)


def _is_layout_copy(e: Event) -> bool:
    if _is_inductor_copy(e.name):
        return True
    if e.name != "aten::copy_" or len(e.input_types) < 2:
        return False
    return e.input_types[0] == e.input_types[1]


def graph_copies(replay: Trace, copy_names: frozenset[str]) -> list[str]:
    """Layout copies inside the CUDA graphs ``replay`` ran: graph kernels named like a known copy.

    ``copy_names`` comes from :meth:`Trace.copy_kernel_names` of an eager run
    of the same op on the same inputs; Inductor's own ``clone`` kernels are
    recognised by name.
    """
    events = [*replay.graph_kernels(), *(m for m in replay.memcpys if replay.in_graph(m))]
    return [
        f"{e.name[:160]} (in the CUDA graph)"
        for e in events
        if e.name in copy_names or _is_inductor_copy(e.name)
    ]


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def parse_chrome_trace(path: Path) -> Trace:
    """Read the complete ("X") events of a Chrome trace written by ``export_chrome_trace``."""
    data = json.loads(path.read_text())
    raw = data.get("traceEvents", []) if isinstance(data, dict) else data
    host: list[Event] = []
    device: list[Event] = []
    launches: set[int] = set()
    for ev in raw:
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        cat, args = str(ev.get("cat", "")), ev.get("args") or {}
        event = Event(
            name=str(ev.get("name", "")),
            category=cat,
            input_types=tuple(str(t) for t in args.get("Input type", ()) or ()),
            input_dims=tuple(args.get("Input Dims", ()) or ()),
            external_id=_int(args.get("External id")),
            correlation=_int(args.get("correlation")),
            graph_id=_int(args.get("graph id")),
            ts=_float(ev.get("ts")),
            dur=_float(ev.get("dur")),
            thread=(ev.get("pid"), ev.get("tid")),
        )
        if cat in HOST_CATEGORIES:
            host.append(event)
        elif cat in KERNEL_CATEGORIES or cat in MEMCPY_CATEGORIES:
            device.append(event)
        elif (
            cat in API_CATEGORIES
            and event.correlation is not None
            and any(fnmatch.fnmatchcase(event.name, p) for p in GRAPH_LAUNCHES)
        ):
            launches.add(event.correlation)
    return _split_harness(path, host, device, frozenset(launches))


def _split_harness(path: Path, host: list[Event], device: list[Event], launches: frozenset[int]) -> Trace:
    """Set aside the harness ranges, the host events inside them and the device work those launched."""
    ranges = [e for e in host if e.name.startswith(HARNESS_PREFIX)]
    inside = [e for e in host if any(r.encloses(e) for r in ranges)] if ranges else []
    left_out = {id(e) for e in inside}
    harness_ids = {e.external_id for e in inside if e.external_id is not None}
    trace = Trace(path=path, graph_launches=launches, harness=inside)
    trace.host = [e for e in host if id(e) not in left_out]
    for e in device:
        if e.external_id in harness_ids and not trace.in_graph(e):
            trace.harness.append(e)
        elif e.category in MEMCPY_CATEGORIES:
            trace.memcpys.append(e)
        else:
            trace.kernels.append(e)
    return trace


def harness(what: str) -> contextlib.AbstractContextManager[Any]:
    """A profiler range marking opgate's own work: nothing inside it counts as the op's."""
    from torch.profiler import record_function

    return record_function(HARNESS_PREFIX + what)


@contextlib.contextmanager
def _interpreter_marked() -> Iterator[None]:
    """Under ``TRITON_INTERPRET=1``, wrap every interpreted launch in a :func:`harness` range.

    The interpreter copies each tensor argument to a host buffer and back
    through ``UntypedStorage.copy_`` (byte tensors): simulator plumbing that
    would otherwise read as hidden copies of ``uint8`` data.  Copies the op
    makes itself, before or after the launch, stay outside the range.
    """
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        yield
        return
    try:
        from triton.runtime.interpreter import GridExecutor
    except ImportError:
        yield
        return
    original = GridExecutor.__call__

    def marked(self: Any, *args: Any, **kwargs: Any) -> Any:
        with harness("triton-interpreter"):
            return original(self, *args, **kwargs)

    GridExecutor.__call__ = marked
    try:
        yield
    finally:
        GridExecutor.__call__ = original


def profile_call(fn: Callable[[], Any], device_kind: str, path: Path) -> tuple[Trace, Any]:
    """Profile one call of ``fn`` (warm it up first: compile and autotune must not be in the trace)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device_kind == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with _interpreter_marked(), profile(activities=activities, record_shapes=True) as prof:
        out = fn()
        if device_kind == "cuda":
            torch.cuda.synchronize()
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))
    return parse_chrome_trace(path), out


def matches(name: str, pattern: str) -> bool:
    """Case-sensitive glob match; ``a|b`` matches when either alternative does (one kernel of several).

    Spaces inside an alternative are part of it (demangled CUDA names have
    them: ``kDequantizeBlockwise<float, 8, 0>``); spaces around ``|`` are not.
    """
    return any(fnmatch.fnmatchcase(name, alt.strip()) for alt in pattern.split("|"))


def match(names: Iterable[str], patterns: Sequence[str]) -> dict[str, list[str]]:
    """For each pattern (see :func:`matches`), the names it matches."""
    names = list(names)
    return {p: [n for n in names if matches(n, p)] for p in patterns}
