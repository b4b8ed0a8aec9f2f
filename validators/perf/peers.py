"""Who an op is benchmarked against: the one definition of benchmark peers.

Every peer is a callable with the op's *reference signature* (what its
``sample_inputs`` feed), so the harness calls all of them on the same inputs.
A peer has a role, which the published table reads from the data:

* ``opgate``  — the spec's own implementations (kind ``triton`` or ``cuda``,
  the CUDA C++ one included), named ``opgate-<impl>``;
* ``variant`` — ``opgate-<impl>-compiled``: ``torch.compile`` of that entry,
  shown beside, judged against nobody;
* ``peer``    — what opgate must beat: ``aten`` (the op written with stock
  PyTorch ops, :data:`ATEN`), ``compile(reference)`` (Inductor on the spec's
  reference) and ``liger`` (Liger-Kernel, through the adapters its op specs
  are validated with: ``ops/external/liger/liger_adapters.py``).

Adding a peer: one entry in :func:`peers_for` (CONTRIBUTING.md says where).
Peers that cannot run here (Liger not installed, a CUDA extension on a CPU
torch) are absent, with the reason in the second value :func:`peers_for`
returns.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from opgate.matrix.spec import OpSpec

OPGATE_PREFIX = "opgate-"
ROLE_OPGATE, ROLE_VARIANT, ROLE_PEER = "opgate", "variant", "peer"
ROLES = (ROLE_OPGATE, ROLE_VARIANT, ROLE_PEER)
#: implementation kinds that are opgate's own kernels (an ``external`` one is a library's)
FIRST_PARTY_KINDS = ("triton", "cuda")
LIGER_ADAPTERS = "opgate.ops.external.liger.liger_adapters"


@dataclass(frozen=True)
class Peer:
    """One timed callable of a benchmark: its column name, its role and the function."""

    name: str
    role: str
    fn: Callable[..., Any]


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


#: The op written with stock PyTorch ops, as a model author would, by op name.
ATEN: dict[str, Callable[..., Any]] = {
    "rms_norm": _aten_rms_norm,
    "fused_add_rms_norm": _aten_add_rms_norm,
    "silu_mul": _aten_silu_mul,
    "layer_norm": _aten_layer_norm,
    "rope": _aten_rope,
}


def liger_peer(op: str) -> Callable[..., Any] | None:
    """Liger-Kernel's function for ``op`` (its adapter of the same name); None when unavailable."""
    try:
        adapters = importlib.import_module(LIGER_ADAPTERS)
    except ImportError:
        return None
    fn = getattr(adapters, op, None)
    return fn if callable(fn) else None


def _first_party(spec: OpSpec) -> tuple[list[Peer], dict[str, str]]:
    """opgate's implementations of ``spec`` and their compiled variants, or why each cannot load."""
    from opgate.matrix.spec import resolve

    found: list[Peer] = []
    missing: dict[str, str] = {}
    for name, impl in spec.implementations.items():
        if impl.kind not in FIRST_PARTY_KINDS:
            continue
        try:
            importlib.import_module(impl.module)
            entry = resolve(impl.entry, spec.root)
        except Exception as exc:  # noqa: BLE001 - e.g. a CUDA extension that does not build here
            missing[OPGATE_PREFIX + name] = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
            continue
        found.append(Peer(OPGATE_PREFIX + name, ROLE_OPGATE, entry))
        found.append(
            Peer(f"{OPGATE_PREFIX}{name}-compiled", ROLE_VARIANT, torch.compile(entry, dynamic=False))
        )
    return found, missing


def peers_for(spec: OpSpec) -> tuple[list[Peer], dict[str, str]]:
    """Every peer of ``spec``'s op, in column order, and ``{name: why}`` for those left out."""
    from opgate.matrix.spec import resolve

    peers, missing = _first_party(spec)
    if spec.op in ATEN:
        peers.append(Peer("aten", ROLE_PEER, ATEN[spec.op]))
    else:
        missing["aten"] = f"no aten peer defined for {spec.op} (validators/perf/peers.py ATEN)"
    reference = resolve(spec.reference, spec.root)
    peers.append(Peer("compile(reference)", ROLE_PEER, torch.compile(reference, dynamic=False)))
    liger = liger_peer(spec.op)
    if liger is not None:
        peers.append(Peer("liger", ROLE_PEER, liger))
    else:
        missing["liger"] = f"liger-kernel not importable, or {LIGER_ADAPTERS} has no {spec.op}"
    return peers, missing
