"""GPU self-test of opgate's CUDA C++ ops: build, check against the references, time.

Run on a CUDA machine from the repository root::

    python -m opgate.ops.rms_norm.cuda.selftest            # correctness + timing table
    python -m opgate.ops.rms_norm.cuda.selftest --quick    # correctness only

Correctness: forward and backward vs the op's reference in float64, over
contiguous, transposed, strided (row-sliced), offset and misaligned inputs.
Timing: triton.testing.do_bench medians (L2 flushed) against aten and the
reference; GB/s counts bytes read + written.  Prints one line per case; exits 1
on any mismatch.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def _layouts(x: torch.Tensor) -> dict[str, torch.Tensor]:
    m, n = x.shape
    big = torch.empty(m, n + 16, dtype=x.dtype, device=x.device)
    big[:, :n] = x
    big[:, 8 : 8 + n] = x
    flat = torch.empty(m * n + 1, dtype=x.dtype, device=x.device)
    flat[1:] = x.reshape(-1)
    return {
        "contiguous": x,
        "transposed": x.t().contiguous().t(),
        "strided": big[:, :n],
        "offset": big[:, 8 : 8 + n],
        "misaligned": flat[1:].view(m, n),
    }


def _relerr(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-12))


def check_op(
    name: str,
    fn: Callable[..., torch.Tensor],
    ref: Callable[..., torch.Tensor],
    make: Callable[..., tuple[torch.Tensor, ...]],
) -> bool:
    ok = True
    for dname, dtype in DTYPES.items():
        for shape in ((67, 1000), (8, 4096), (5, 33), (256, 8192)):
            base = make(shape, dtype)
            for lname, x in _layouts(base[0]).items():
                args = (x, *base[1:])
                leaves = [
                    a.detach().clone().requires_grad_(True) if a.is_floating_point() else a for a in args
                ]
                y = fn(*leaves)
                g = torch.randn_like(y)
                y.backward(g)
                r_leaves = [a.detach().double().requires_grad_(True) for a in args]
                yr = ref(*r_leaves)
                yr.backward(g.double())
                grads = [(a.grad, b.grad) for a, b in zip(leaves, r_leaves, strict=True)]
                errs = [_relerr(y.detach(), yr.detach())] + [
                    _relerr(ga, gb) for ga, gb in grads if ga is not None and gb is not None
                ]
                bad = max(errs) > TOL[dtype] * (4 if dtype is not torch.float32 else 1)
                ok &= not bad
                if bad:
                    print(f"MISMATCH {name} {dname} {shape} {lname}: relerr fwd/grads {errs}")
    print(f"{name}: correctness {'ok' if ok else 'FAILED'}")
    return ok


def bench(label: str, fn: Callable[[], object], nbytes: int) -> None:
    import triton

    ms = triton.testing.do_bench(fn, return_mode="median")
    print(f"  {label:<28} {ms * 1e3:9.1f} us  {nbytes / ms / 1e6:8.0f} GB/s")


def _silu_mul_aten(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.silu(a) * b


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="correctness only")
    args = parser.parse_args()
    from opgate.ops.rms_norm import cuda_impl as rms
    from opgate.ops.silu_mul import cuda_impl as swi

    print(
        f"torch {torch.__version__}, {torch.cuda.get_device_name()}, cc {torch.cuda.get_device_capability()}"
    )
    print(
        f"rms_norm library {rms.BUILT.library} (cache hit {rms.BUILT.cache_hit}, {rms.BUILT.build_s:.1f} s)"
    )
    dev = "cuda"

    def rms_ref(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    def rms_make(shape: tuple[int, int], dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        return torch.randn(shape, dtype=dtype, device=dev), torch.rand(
            shape[1], dtype=dtype, device=dev
        ) + 0.5

    def swi_make(shape: tuple[int, int], dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        return 2 * torch.randn(shape, dtype=dtype, device=dev), torch.randn(shape, dtype=dtype, device=dev)

    ok = check_op("rms_norm", lambda x, w: rms.rms_norm(x, w, 1e-6), rms_ref, rms_make)
    ok &= check_op("silu_mul", swi.silu_mul, lambda a, b: F.silu(a) * b, swi_make)
    if args.quick:
        return 0 if ok else 1
    for m, n in ((8, 4096), (4096, 4096), (32768, 8192), (65536, 4096)):
        x, w = rms_make((m, n), torch.bfloat16)
        g = torch.randn_like(x)
        nb = 2 * x.numel() * x.element_size() + w.numel() * w.element_size()
        print(f"rms_norm bf16 {m}x{n}")
        bench("opgate_cuda fwd", functools.partial(rms.rms_norm, x, w, 1e-6), nb)
        bench("aten F.rms_norm fwd", functools.partial(F.rms_norm, x, (n,), w, 1e-6), nb)
        nb_bwd = 3 * x.numel() * x.element_size() + 2 * w.numel() * w.element_size()  # x, dy, dx, w, dw
        bench(
            "opgate_cuda bwd",
            functools.partial(torch.ops.opgate_cuda.rms_norm_backward, g, x, w, 1e-6),
            nb_bwd,
        )
        a, b = swi_make((m, n), torch.bfloat16)
        print(f"silu_mul bf16 {m}x{n}")
        bench("opgate_cuda fwd", functools.partial(swi.silu_mul, a, b), 3 * a.numel() * 2)
        bench("aten silu(a)*b fwd", functools.partial(_silu_mul_aten, a, b), 3 * a.numel() * 2)
        bench(
            "opgate_cuda bwd",
            functools.partial(torch.ops.opgate_cuda.silu_mul_backward, g, a, b),
            5 * a.numel() * 2,
        )
    copy_src = torch.empty(2**30, dtype=torch.bfloat16, device=dev)
    copy_dst = torch.empty_like(copy_src)
    bench("device copy (reference)", lambda: copy_dst.copy_(copy_src), 2 * copy_src.numel() * 2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
