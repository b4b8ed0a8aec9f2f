"""Launch replay: the C++ dispatch path that takes Python off the hot path of opgate's Triton ops.

A Triton op registered with ``torch.library.custom_op`` pays Python on every
call: the custom_op dispatch, the Python launcher, Triton's argument binder,
and a Python autograd Function in backward (~700 us per forward+backward
measured on the H200's host, against aten's ~80 us).  :func:`attach` puts a C++
kernel (``replay.cpp``) in front of the op on the CUDA dispatch key and a C++
autograd kernel on AutogradCUDA:

* the first call with a given key (dtypes, sizes, strides, pointer alignment,
  scalar arguments) runs the op's own Python implementation while
  :class:`~opgate.ops._replay.record.Recorder` records its Triton launches
  into a plan; later calls with that key are replayed in C++ (allocate, fill
  the parameter block, ``cuLaunchKernel`` on the current stream);
* the backward is the op's :class:`~opgate.ops._replay.formula.Formula`, run
  by one generic C++ autograd Node.

The Python registration (custom_op or triton_op) stays the op's definition:
it still serves CPU tensors (the Triton interpreter), fake tensors, tracing and
export; the kernels launched are the ones Triton's JIT compiled.  Nothing is
attached where replay cannot help or cannot build: no CUDA device, a CPU-only
torch, no nvcc, no opgate builder (the library is built by the harness,
:mod:`opgate.ops._extension`), or ``OPGATE_REPLAY=0``; :func:`status` says which.

When the library is not built yet, an import builds it on a background thread
and the op runs its Python path until then: which path a call takes depends on
how long ago the process started.  ``OPGATE_REPLAY_BUILD=wait`` (what
opgate's GPU workers run with) builds or loads it before :func:`attach`
returns instead, so every call of the process takes the replay path: a check
sees the same path whenever it runs.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from opgate.ops._replay.formula import Formula
from opgate.ops._replay.record import Recorder

SOURCE = Path(__file__).resolve().parent / "replay.cpp"
LIBRARY_NAME = "opgate_replay"
ABI = 1
#: Plain-Python implementation of every attached op, by qualname (what a plan miss runs).
_IMPLS: dict[str, Callable[..., Any]] = {}
#: Why a recording was refused, by qualname (the last reason): what stays on the Python path.
REFUSED: dict[str, str] = {}
_STATE: dict[str, Any] = {"lib": None, "why": None}
#: Ops attached while the library builds in the background: registered when it is loaded.
_PENDING: list[tuple[str, Callable[..., Any], Formula | None, str, str]] = []
ARCHES = ("sm_80", "sm_90")
_LOCK = threading.Lock()
_PENDING_LOCK = threading.Lock()


def _handle(qualname: str, args: tuple[Any, ...], record: bool) -> tuple[tuple[Any, ...], bytes | None]:
    """Called by the C++ kernel on a plan miss (``record``) or for a key it cannot replay."""
    impl = _IMPLS[qualname]
    if not record and _STATE.get("offline_target") is None:
        out = impl(*args)
        return (out if isinstance(out, tuple) else (out,)), None
    rec = Recorder(args, offline_target=_STATE.get("offline_target"))
    try:
        with rec:
            out = impl(*args)
        outs = out if isinstance(out, tuple) else (out,)
        plan = rec.plan(outs) if record else None
        if plan is None and rec.refused:
            REFUSED[qualname] = rec.refused
    finally:
        rec.release()
    return outs, plan


def _unavailable() -> str | None:
    import torch

    if os.environ.get("OPGATE_REPLAY", "1") in ("0", "off", "false"):
        return "OPGATE_REPLAY=0"
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build"
    if not torch.cuda.is_available() and _STATE.get("offline_target") is None and keys()[0] != "CPU":
        return "no CUDA device (nothing to replay on)"
    return None


#: ``OPGATE_REPLAY_BUILD`` values: build in the background (the default) or before attaching.
BUILD_MODES = ("background", "wait")


def build_waits() -> bool:
    """Whether :func:`attach` builds or loads the library before it returns (``OPGATE_REPLAY_BUILD=wait``)."""
    mode = os.environ.get("OPGATE_REPLAY_BUILD", "background").strip().lower() or "background"
    if mode not in BUILD_MODES:
        raise ValueError(f"OPGATE_REPLAY_BUILD must be one of {', '.join(BUILD_MODES)}, got {mode!r}")
    return mode == "wait"


def keys() -> tuple[str, str]:
    """(backend, autograd) dispatch keys the ops attach at: CUDA by default.

    ``OPGATE_REPLAY_KEYS=CPU,AutogradCPU`` attaches at the CPU keys instead, so the
    C++ autograd kernel is validated by the CPU matrix (replay itself then
    refuses every plan: interpreted launches are invisible to the recorder).
    """
    raw = os.environ.get("OPGATE_REPLAY_KEYS", "CUDA,AutogradCUDA").split(",")
    if len(raw) != 2 or not all(raw):
        raise ValueError(
            f"OPGATE_REPLAY_KEYS must be BACKEND,AUTOGRAD, got {os.environ['OPGATE_REPLAY_KEYS']!r}"
        )
    return raw[0].strip(), raw[1].strip()


def library(*, build: bool = True, wait: bool = True) -> ctypes.PyDLL | None:
    """The loaded replay library, or None with :func:`status` saying why.

    ``wait=False`` (what :func:`attach` uses at import): load it if a build is
    cached, else build it on a background thread and attach the pending ops
    when it is ready, so importing an op never waits minutes for a compiler;
    until then the op runs on its Python path.  ``wait=True`` builds now.
    """
    thread = _STATE.get("thread")
    if not wait and thread is not None and thread.is_alive():
        return None  # being built; never block an import on the build lock
    with _LOCK:
        if _STATE["lib"] is not None or not build or _STATE["why"] is not None:
            return _loaded()
        why = _unavailable()
        if why is not None:
            _STATE["why"] = why
            return None
        if not wait and not _cached():
            if _STATE.get("thread") is None:
                _STATE["thread"] = threading.Thread(
                    target=_build_then_attach, name="opgate-replay", daemon=True
                )
                _STATE["thread"].start()
            return None
        _load()
        return _loaded()


def _loaded() -> ctypes.PyDLL | None:
    lib: ctypes.PyDLL | None = _STATE["lib"]
    return lib


def _cached() -> bool:
    from opgate.ops._extension import CudaBuildUnsupported, builder

    try:
        return builder().cached_library(LIBRARY_NAME, [SOURCE], ARCHES, False) is not None
    except CudaBuildUnsupported:
        return True  # nothing to wait for: _load reports why


def _load() -> None:
    """Build (cached) and load; record why not on failure.  Called with ``_LOCK`` held."""
    try:
        from opgate.ops._extension import builder

        built = builder().load_library(LIBRARY_NAME, [SOURCE], ARCHES, install=False)
        lib = ctypes.PyDLL(str(built.library))
        _declare(lib)
        if lib.opgate_replay_abi() != ABI:
            raise RuntimeError(f"{built.library}: ABI {lib.opgate_replay_abi()}, expected {ABI}")
        lib.opgate_replay_set_handler(_handle)
        _STATE["lib"] = lib
        _STATE["library_path"] = str(built.library)
    except Exception as exc:  # noqa: BLE001 - replay is an accelerator: the Python path stays
        _STATE["why"] = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"


def _build_then_attach() -> None:
    with _LOCK:
        if _STATE["lib"] is None and _STATE["why"] is None:
            _load()
    with _PENDING_LOCK:
        _STATE["built"] = True
        pending = list(_PENDING)
        _PENDING.clear()
    for args in pending:
        _register_quietly(*args)


def _register_quietly(*args: Any) -> None:
    """:func:`_register` for the background thread: an op that cannot attach keeps its Python path."""
    try:
        _register(*args)
    except RuntimeError as exc:
        REFUSED[args[0]] = str(exc)


def _declare(lib: ctypes.PyDLL) -> None:
    lib.opgate_replay_abi.restype = ctypes.c_int
    lib.opgate_replay_register.restype = ctypes.c_int
    lib.opgate_replay_register.argtypes = [ctypes.c_char_p] * 4 + [ctypes.c_char_p, ctypes.c_size_t]
    lib.opgate_replay_set_handler.argtypes = [ctypes.py_object]
    lib.opgate_replay_set_handler.restype = None
    lib.opgate_replay_stats.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_int64)]
    lib.opgate_replay_stats.restype = None
    lib.opgate_replay_set_dry_run.argtypes = [ctypes.c_int]
    lib.opgate_replay_set_bypass.argtypes = [ctypes.c_int]
    lib.opgate_replay_take_log.argtypes = [ctypes.POINTER(ctypes.c_int64), ctypes.c_size_t]
    lib.opgate_replay_take_log.restype = ctypes.c_size_t
    lib.opgate_replay_clear.restype = None


def attach(
    qualname: str,
    impl: Callable[..., Any],
    formula: Formula | None = None,
    *,
    backend_key: str | None = None,
    autograd_key: str | None = None,
) -> bool:
    """Serve ``qualname`` (an op already defined, e.g. by custom_op) from the replay path on ``backend_key``.

    ``impl``: the op's plain Python implementation (what custom_op wraps);
    ``formula``: its autograd, or None for an op without one (a backward
    through it raises, as custom_op's does); the keys default to :func:`keys`
    (an empty ``autograd_key`` attaches no autograd).  Returns whether it attached.
    """
    default_backend, default_autograd = keys()
    backend_key = default_backend if backend_key is None else backend_key
    autograd_key = default_autograd if autograd_key is None else autograd_key
    library(wait=build_waits())
    with _PENDING_LOCK:
        if _STATE["lib"] is None:
            building = _STATE.get("thread") is not None and not _STATE.get("built")
            if building:
                _PENDING.append((qualname, impl, formula, backend_key, autograd_key))
            return False
    return _register(qualname, impl, formula, backend_key, autograd_key)


def _register(
    qualname: str, impl: Callable[..., Any], formula: Formula | None, backend_key: str, autograd_key: str
) -> bool:
    lib = _STATE["lib"]
    if lib is None or qualname in _IMPLS:
        return qualname in _IMPLS
    _IMPLS[qualname] = impl
    err = ctypes.create_string_buffer(512)
    rc = lib.opgate_replay_register(
        qualname.encode(), backend_key.encode(), autograd_key.encode(),
        (formula.encode() if formula else "").encode(), err, len(err),
    )  # fmt: skip
    if rc != 0:
        del _IMPLS[qualname]
        raise RuntimeError(f"replay: cannot attach {qualname}: {err.value.decode()}")
    return True


def status() -> dict[str, Any]:
    """Whether replay is on here, why not, and per attached op: hits, misses, Python calls, plans."""
    lib = library(build=False)
    out: dict[str, Any] = {"enabled": lib is not None, "why_not": _STATE["why"], "ops": {}}
    if lib is not None:
        for q in _IMPLS:
            buf = (ctypes.c_int64 * 4)()
            lib.opgate_replay_stats(q.encode(), buf)
            out["ops"][q] = dict(zip(("hits", "misses", "python_calls", "plans"), list(buf), strict=True))
            if q in REFUSED:
                out["ops"][q]["refused"] = REFUSED[q]
    return out


def clear() -> None:
    """Forget every plan (e.g. after changing a launch heuristic such as ``BWD_TUNING``)."""
    lib = library(build=False)
    if lib is not None:
        lib.opgate_replay_clear()


@contextlib.contextmanager
def bypassed() -> Iterator[None]:
    """Every call of an attached op goes to its Python implementation meanwhile (to compare the paths)."""
    lib = library(build=False)
    if lib is not None:
        lib.opgate_replay_set_bypass(1)
    try:
        yield
    finally:
        if lib is not None:
            lib.opgate_replay_set_bypass(0)
