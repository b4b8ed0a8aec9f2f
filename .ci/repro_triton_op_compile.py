#!/usr/bin/env python3
"""Does ``zoo::triton_op_rms_norm`` fail under ``torch.compile`` without opgate? (GPU only)

The zoo's control op, registered as PyTorch's docs teach (``triton_op`` +
``wrap_triton``), gets ``error`` in its compile cells on the H200 (torch
2.11.0+cu130, Triton 3.6.0): ``launcher() missing 1 required positional
argument: '_grid_2'`` inside Inductor's generated code.  This script runs the
op in plain user code, no opgate import, the way those cells do: inside a
small graph (the weight made inside it, the output negated after it),
``torch.compile(fullgraph=True)``, the spec's two shapes, each case in a fresh
process with empty Inductor and Triton caches.

    python3 .ci/repro_triton_op_compile.py                 # the zoo op, every dtype and layout
    python3 .ci/repro_triton_op_compile.py --eager-first   # the op launched eagerly before each call
    python3 .ci/repro_triton_op_compile.py --constexpr     # the same kernel, its defaulted constexpr
                                                           # passed, dynamic=True and dynamic=None

The zoo kernel declares ``TWICE: tl.constexpr = False`` and the op leaves it
out, as Triton allows.  Inductor's wrapper of a user kernel counts the
kernel's parameters with it (torch warns "Incorrect number of arguments
passed to kernel") and its launcher then takes one argument more than the
generated call gives.  A case prints ``ok`` or the error's first line.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ZOO = Path(__file__).resolve().parent.parent / "tests" / "zoo"
SHAPES = ((67, 1000), (8, 2048))
DTYPES = ("float32", "float16", "bfloat16")
LAYOUTS = ("contiguous", "strided", "zero_size", "transposed")


def _constexpr_passed_op() -> Any:
    """The zoo op's body with ``TWICE=False`` passed: the one change from ``zoo_ops.triton_op``."""
    import torch
    import triton
    from torch.library import triton_op, wrap_triton
    from zoo_ops.kernels import NATIVE, _zoo_rms_fwd_kernel, compute_type

    def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
        m, n = x.shape
        y = x.new_empty((m, n))
        ct = compute_type(x.dtype)

        def grid(meta: dict[str, Any]) -> tuple[int]:
            return (triton.cdiv(m, meta["BLOCK_M"]),)

        wrap_triton(_zoo_rms_fwd_kernel)[grid](
            x, w, y, m, n, x.stride(0), x.stride(1), w.stride(0), y.stride(0), y.stride(1), eps,
            BLOCK_M=16, BLOCK_N=512, CT=ct, ACC=ct, ROUND_ACC=NATIVE, ROUND_OUT=NATIVE, TWICE=False,
        )  # fmt: skip
        return y

    # this file's annotations are strings (``from __future__``) naming a torch imported here, not
    # at module level, where torch.library would resolve them: hand it the types themselves
    rms_norm.__annotations__ = {"x": torch.Tensor, "w": torch.Tensor, "eps": float, "return": torch.Tensor}
    return triton_op("repro::rms_norm_constexpr_passed", mutates_args=())(rms_norm)


def case(dtype_name: str, layout: str, flags: list[str]) -> str:
    """Compile and run the op in its graph for both shapes: "ok" or the error."""
    import torch

    sys.path.insert(0, str(ZOO))
    if "--constexpr" in flags:
        rms_norm = _constexpr_passed_op()
    else:
        from zoo_ops.triton_op import rms_norm
    dtype = getattr(torch, dtype_name)

    def graph(x: torch.Tensor, w_neg: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        w = -w_neg  # the weight is made inside the graph, as in a model
        y = rms_norm(x, w, eps=1e-6)
        return y, -y

    def make(shape: tuple[int, int]) -> torch.Tensor:
        x = torch.randn(shape, device="cuda").to(dtype)
        if layout == "strided":
            buf = torch.full((shape[0], 2 * shape[1]), float("nan"), device="cuda", dtype=dtype)
            view = buf[:, ::2]
            view.copy_(x)
            return view
        if layout == "zero_size":
            return x.new_empty((0, shape[1]))
        if layout == "transposed":
            return x.t().contiguous().t()
        return x

    fn = torch.compile(graph, fullgraph=True, dynamic=None if "--static" in flags else True)
    try:
        for shape in SHAPES:
            x = make(shape)
            w = (1.0 + 0.5 * torch.randn(shape[1], device="cuda")).to(dtype)
            if "--eager-first" in flags:  # the kernel launched eagerly before the compiled graph runs
                rms_norm(x, w, eps=1e-6)
            y, _ = fn(x, -w)
            ref = rms_norm(x, w, eps=1e-6)
            if not torch.equal(y.isnan(), ref.isnan()) or (y - ref).abs().nan_to_num().max().item() > 0.05:
                return f"wrong numbers at shape {shape}"
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - the case's outcome is what is printed
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    return "ok"


def _fresh(dtype_name: str, layout: str, flags: list[str]) -> str:
    """One case in a process of its own, with empty caches."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": f"{tmp}/ind", "TRITON_CACHE_DIR": f"{tmp}/tri"}
        argv = [sys.executable, __file__, "--case", dtype_name, layout, *flags]
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        out = (proc.stdout.strip().splitlines() or [f"exit {proc.returncode}: {proc.stderr[-200:]}"])[-1]
        dynamic = "dynamic=None" if "--static" in flags else "dynamic=True"
        return f"{dtype_name:9} {layout:11} {dynamic:12} {out}"


def main() -> int:
    flags = [a for a in sys.argv[1:] if a in {"--eager-first", "--constexpr", "--static"}]
    if len(sys.argv) > 3 and sys.argv[1] == "--case":
        print(case(sys.argv[2], sys.argv[3], flags))
        return 0
    runs = [(d, lay, flags) for d in DTYPES for lay in LAYOUTS]
    if "--constexpr" in flags:  # passed: both dynamic settings, one layout per dtype is enough to show it
        runs = [(d, "strided", f) for d in DTYPES for f in (flags, [*flags, "--static"])]
    with ThreadPoolExecutor(max_workers=6) as pool:
        for line in pool.map(lambda r: _fresh(*r), runs):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
