"""Who an opgate op is benchmarked against: aten, torch.compile of the reference, Liger-Kernel.

Every peer is a callable with the op's *reference signature* (what its
``sample_inputs`` feed), so the harness can call all of them on the same
inputs.  An op's own ``ops/<op>/bench.py`` is reused: its ``impls()`` list
(or a ``PEERS`` dict) supplies peers under normalised names
(:func:`peer_name`), and they win over the generic ones here, so each peer
has one definition, owned by the op's author; its ``problems()`` supplies the
backward byte count where the spec declares none.

Peers that cannot run here (Liger not installed, a layout Liger does not
take) are absent, with the reason in :func:`unavailable`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

Peer = Callable[..., Any]


def _aten_rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), w, eps)


def _aten_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    h = x + residual
    return F.rms_norm(h, (h.shape[-1],), w, eps), h


def _aten_silu_mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.silu(a) * b


def _aten_layer_norm(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float = 1e-5, gelu: bool = False
) -> torch.Tensor:
    y = F.layer_norm(x, (x.shape[-1],), w, b, eps)
    return F.gelu(y) if gelu else y


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _aten_rope(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str = "bshd"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate-half RoPE in the input dtype, as model code writes it."""
    dim = 2 if layout == "bshd" else 1  # the heads axis cos/sin broadcast over
    c = (cos if cos.dim() == 3 else cos[None]).unsqueeze(dim)
    s = (sin if sin.dim() == 3 else sin[None]).unsqueeze(dim)
    return q * c + _rotate_half(q) * s, k * c + _rotate_half(k) * s


ATEN: dict[str, Peer] = {
    "rms_norm": _aten_rms_norm,
    "fused_add_rms_norm": _aten_add_rms_norm,
    "silu_mul": _aten_silu_mul,
    "layer_norm": _aten_layer_norm,
    "rope": _aten_rope,
}


def _liger(name: str) -> Any:
    module = importlib.import_module("liger_kernel.transformers.functional")
    return getattr(module, name)


def _liger_rms_norm() -> Peer:
    fn = _liger("liger_rms_norm")
    return lambda x, w, eps=1e-6: fn(x, w, eps)


def _liger_add_rms_norm() -> Peer:
    fn = _liger("liger_fused_add_rms_norm")
    return lambda x, residual, w, eps=1e-6: fn(x, residual, w, eps)


def _liger_silu_mul() -> Peer:
    fn: Peer = _liger("liger_swiglu")
    return fn


def _liger_layer_norm() -> Peer:
    fn = _liger("liger_layer_norm")

    def layer_norm(x: Any, w: Any, b: Any, eps: float = 1e-5, gelu: bool = False) -> Any:
        if gelu:
            raise NotImplementedError("Liger's layer_norm has no fused GELU")
        return fn(x, w, b, eps)

    return layer_norm


def _liger_rope() -> Peer:
    fn = _liger("liger_rope")

    def rope(q: Any, k: Any, cos: Any, sin: Any, layout: str = "bshd") -> Any:
        if layout != "bhsd":
            raise NotImplementedError("Liger's rope takes (B, H, S, D) only")
        return fn(q, k, cos if cos.dim() == 3 else cos[None], sin if sin.dim() == 3 else sin[None])

    return rope


_LIGER: dict[str, Callable[[], Peer]] = {
    "rms_norm": _liger_rms_norm,
    "fused_add_rms_norm": _liger_add_rms_norm,
    "silu_mul": _liger_silu_mul,
    "layer_norm": _liger_layer_norm,
    "rope": _liger_rope,
}


def liger_peer(op: str) -> Peer | None:
    """Liger-Kernel's function for ``op`` in the reference signature; None when unavailable."""
    make = _LIGER.get(op)
    if make is None:
        return None
    try:
        return make()
    except (ImportError, AttributeError):
        return None


def _bench_module(op: str) -> Any:
    try:
        return importlib.import_module(f"opgate.ops.{op}.bench")
    except ImportError:
        return None


def peer_name(name: str) -> str:
    """An op bench's label as a column name: ``"aten F.rms_norm"`` -> ``"aten"``,
    ``"liger (+F.gelu)"`` -> ``"liger"``, ``"opgate triton, compiled"`` -> ``"opgate-triton-compiled"``."""
    low = name.strip().lower()
    for family in ("aten", "liger"):
        if low.startswith(family):
            return family
    return "-".join(low.replace(",", " ").split())


def op_bench_peers(op: str) -> dict[str, Peer]:
    """Peers defined by the op's author in ``ops/<op>/bench.py``: ``PEERS`` or its ``impls()`` list."""
    module = _bench_module(op)
    if module is None:
        return {}
    peers = getattr(module, "PEERS", None)
    if isinstance(peers, dict):
        return {str(k): v for k, v in peers.items() if callable(v)}
    impls = getattr(module, "impls", None)
    if not callable(impls):
        return {}
    return {peer_name(name): fn for name, fn in impls() if callable(fn)}


def op_bench_bytes(op: str, shape: tuple[int, ...], dtype: Any, dtype_name: str) -> tuple[Any, Any]:
    """(forward, backward) bytes as ``ops/<op>/bench.py`` counts them (on meta tensors); Nones if absent."""
    module = _bench_module(op)
    problems = getattr(module, "problems", None) if module is not None else None
    if not callable(problems):
        return None, None
    try:
        problem = problems(tuple(shape), dtype, dtype_name, torch.device("meta"))
    except Exception:  # noqa: BLE001 - an author's problems() that cannot run on meta tensors: no figure
        return None, None
    return getattr(problem, "fwd_bytes", None), getattr(problem, "bwd_bytes", None)


def peers_for(op: str, reference: Peer) -> dict[str, Peer]:
    """aten, compile(reference), liger (when importable), then the op author's peers on top.

    The author's own entries for opgate's implementations (``opgate triton``) are
    dropped: the harness takes those from the spec; other opgate variants
    (``opgate triton, compiled``) stay.
    """
    found: dict[str, Peer] = {}
    if op in ATEN:
        found["aten"] = ATEN[op]
    found["compile(reference)"] = torch.compile(reference, dynamic=False)
    liger = liger_peer(op)
    if liger is not None:
        found["liger"] = liger
    found.update(op_bench_peers(op))
    return found


def drop_duplicates(peers: dict[str, Peer], own: dict[str, Peer]) -> dict[str, Peer]:
    """``peers`` without the names the harness already has in ``own`` (the spec's implementations)."""
    return {name: fn for name, fn in peers.items() if name not in own}


def unavailable(op: str) -> dict[str, str]:
    """Peers left out for ``op`` and why (shown under the table)."""
    out = {}
    if op not in ATEN:
        out["aten"] = f"no aten peer defined for {op}"
    if liger_peer(op) is None:
        out["liger"] = "liger-kernel not importable (or has no function for this op)"
    return out
