"""``opgate perf block``: the decoder block's parity and step times, on the GPU.

Times, all interleaved within their group so drift hits every variant alike:

* the block forward (no grad) and a training step (forward + backward) for
  {opgate, torch} x {eager, compile};
* each of the four ops alone on the exact inputs it gets inside the block
  (strided q/k from the QKV split, strided gate/up from the MLP split):
  opgate, stock eager, stock compiled.

Flag ``faster alone, slower in the block``: an opgate op beats the stock op
alone, yet the opgate block is slower than the stock block in that mode.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from opgate.validators.perf.block import (
    BLOCK_OPS,
    BlockConfig,
    Ops,
    build,
    inputs,
    opgate_ops,
    relerr,
    torch_ops,
)
from opgate.validators.perf.block_md import render_md
from opgate.validators.perf.timing import TimingConfig

MODES = ("eager", "compile")
BLOCK_TIMING = TimingConfig()


def _op_inputs(cfg: BlockConfig, x: Any, cos: Any, sin: Any, block: Any) -> dict[str, tuple[Any, ...]]:
    """Each op's arguments with the shapes and strides it sees inside the block."""
    import torch.nn.functional as F

    b, s, hid = x.shape
    shape = (b, s, cfg.heads, cfg.head_dim)
    with_grad = x.detach()
    q, k, _ = F.linear(with_grad, block.wqkv.detach()).split(hid, dim=-1)
    gate, up = F.linear(with_grad, block.wgu.detach()).chunk(2, dim=-1)
    w = block.norm1.detach()
    return {
        "rms_norm": (with_grad, w, cfg.eps),
        "fused_add_rms_norm": (with_grad.clone(), with_grad, w, cfg.eps),
        "silu_mul": (gate, up),
        "rope": (q.view(shape), k.view(shape), cos, sin, "bshd"),
    }


def _bind(fn: Any, args: tuple[Any, ...]) -> Any:
    return lambda: fn(*args)


def _alone(
    variants: dict[str, Ops], args: dict[str, tuple[Any, ...]], device: Any, compiled: bool
) -> dict[str, Any]:
    """Each op alone: opgate, stock eager, stock compiled, interleaved (forward, no grad)."""
    import torch

    from opgate.validators.perf.timing import time_interleaved

    out: dict[str, Any] = {}
    with torch.no_grad():
        for op in BLOCK_OPS:
            stock = getattr(variants["torch"], op)
            fns = {
                "opgate": _bind(getattr(variants["opgate"], op), args[op]),
                "torch": _bind(stock, args[op]),
            }
            if compiled:
                fns["torch-compile"] = _bind(torch.compile(stock, dynamic=False), args[op])
            out[op] = {name: t.summary() for name, t in time_interleaved(fns, BLOCK_TIMING, device).items()}
    return out


def _flags(blocks: dict[str, Any], alone: dict[str, Any]) -> list[dict[str, Any]]:
    """Ops faster alone whose block (same mode, forward) is slower than the stock block."""
    flags = []
    for mode in MODES:
        mine, stock = blocks["forward"].get(f"opgate/{mode}"), blocks["forward"].get(f"torch/{mode}")
        if mine is None or stock is None or mine["median_us"] <= stock["median_us"]:
            continue
        peer = "torch" if mode == "eager" else "torch-compile"
        for op, t in alone.items():
            if t["opgate"]["median_us"] < t[peer]["median_us"]:
                flags.append({
                    "op": op, "mode": mode, "alone_us": t["opgate"]["median_us"],
                    "peer_alone_us": t[peer]["median_us"], "block_us": mine["median_us"],
                    "peer_block_us": stock["median_us"], "flag": "faster alone, slower in the block",
                })  # fmt: skip
    return flags


def run_block(
    cfg: BlockConfig, out: Path, device: str = "cuda", modes: tuple[str, ...] = MODES
) -> dict[str, Any]:
    """Parity, block times and op-alone times; writes ``out/block.json`` and ``out/block.md``."""
    import torch

    from opgate.ops.base import DTYPES
    from opgate.validators.perf.report import require_cuda, run_info, write_outputs
    from opgate.validators.perf.timing import time_interleaved

    if device.startswith("cuda"):
        require_cuda("opgate perf block")
    t0 = time.perf_counter()
    dtype, dev = DTYPES[cfg.dtype], torch.device(device)
    variants = {"opgate": opgate_ops(), "torch": torch_ops()}
    info = run_info()
    x, cos, sin = inputs(cfg, dev, dtype)
    with torch.no_grad():
        ref = build(cfg, torch_ops(), dev, torch.float32)(x.float(), cos.float(), sin.float())
    blocks_by_name = {name: build(cfg, ops, dev, dtype) for name, ops in variants.items()}
    runners = {
        f"{name}/{mode}": (blk if mode == "eager" else torch.compile(blk))
        for name, blk in blocks_by_name.items()
        for mode in modes
    }
    parity: dict[str, float] = {}
    with torch.no_grad():
        for key, fn in runners.items():
            parity[key] = relerr(fn(x, cos, sin), ref)
    del ref
    xg = x.detach().clone().requires_grad_(True)
    grad = torch.randn(x.shape, generator=torch.Generator().manual_seed(cfg.seed + 2)).to(dev, dtype)

    def forward(fn: Any) -> Any:
        def call() -> Any:
            with torch.no_grad():
                return fn(x, cos, sin)

        return call

    def step(fn: Any, params: list[Any]) -> Any:
        def call() -> None:
            for p in [*params, xg]:
                p.grad = None
            fn(xg, cos, sin).backward(grad)

        return call

    params = {k: list(blocks_by_name[k.split("/")[0]].parameters()) for k in runners}
    blocks = {
        "forward": {
            k: t.summary()
            for k, t in time_interleaved(
                {k: forward(f) for k, f in runners.items()}, BLOCK_TIMING, dev
            ).items()
        },
        "step": {
            k: t.summary()
            for k, t in time_interleaved(
                {k: step(f, params[k]) for k, f in runners.items()}, BLOCK_TIMING, dev
            ).items()
        },
    }
    alone = _alone(variants, _op_inputs(cfg, x, cos, sin, blocks_by_name["torch"]), dev, "compile" in modes)
    data = {
        "config": dataclasses.asdict(cfg),
        "info": info,
        "parity_relerr": parity,
        "blocks": blocks,
        "alone": alone,
        "flags": _flags(blocks, alone),
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    for group in blocks.values():
        for t in group.values():
            t.pop("samples_us")
    write_outputs(out, "block", data, render_md(data).splitlines())
    return data
