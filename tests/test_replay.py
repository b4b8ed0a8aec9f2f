"""Launch replay (ops/_replay) verified without a GPU: plans, parameter blocks, keys, autograd.

Needs a CUDA build of torch and nvcc (the extension links c10_cuda); runs on CPU
tensors: recording is *offline* (launches are cross-compiled for sm_90 instead
of run, so the parameter list is checked against real PTX) and the replay
kernel is registered on the CPU key of a test namespace with the driver call
replaced by a log (``dry run``).  Only ``cuLaunchKernel`` itself is left to the
GPU step (``.ci/gpu`` step ``perf17``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.integration,  # each case runs in an interpreter of its own
    pytest.mark.skipif(
        torch.version.cuda is None, reason="needs a CUDA build of torch (replay links c10_cuda)"
    ),
    pytest.mark.skipif(
        os.environ.get("TRITON_INTERPRET") not in (None, "", "0"),
        reason="offline recording compiles real kernels",
    ),
]
ROOT = Path(__file__).resolve().parent.parent

PRELUDE = """
import ctypes, struct, torch
from triton.backends.compiler import GPUTarget
import opgate.validators  # installs the harness's builder, which builds the replay library
from opgate.ops import _replay as replay
from opgate.ops._replay import record
replay._STATE["offline_target"] = GPUTarget("cuda", 90, 32)
lib = replay.library()
assert lib is not None, replay._STATE["why"]
lib.opgate_replay_set_dry_run(1)

def take_log():
    n = lib.opgate_replay_take_log(None, 0)
    buf = (ctypes.c_int64 * n)()
    lib.opgate_replay_take_log(buf, n)
    words, launches, i = list(buf), [], 0
    while i < len(words):
        fn, gx, gy, gz, threads, shared, np_ = words[i:i + 7]
        i += 7
        params = [(words[i + 2 * k], words[i + 2 * k + 1]) for k in range(np_)]
        i += 2 * np_
        launches.append(dict(grid=(gx, gy, gz), threads=threads, shared=shared, params=params))
    return launches

def expected(rec, args, buffers):
    # what the recorder saw, with pointers resolved: (size, value) per parameter, per launch
    out = []
    for la in rec.launches:
        ps = []
        for kind, size, a, b in la.params:
            if kind == record.INPUT_PTR:
                v = args[a].data_ptr() + b
            elif kind == record.BUFFER_PTR:
                v = buffers[a] + b
            elif kind == record.LITERAL:
                v = b & ((1 << (8 * size)) - 1)
            else:
                v = 0
            ps.append((size, v))
        out.append(dict(grid=la.grid, threads=la.threads, shared=la.shared, params=ps))
    return out

def define(name, schema):
    lib_ = torch.library.Library("opgate_replay_test", "FRAGMENT")
    lib_.define(schema)
    KEEP.append(lib_)
    return getattr(torch.ops.opgate_replay_test, name)
KEEP = []
"""


def _run(body: str, timeout: float = 600) -> str:
    """Run ``body`` after PRELUDE in a fresh interpreter (a file: Triton reads kernels' source)."""
    import tempfile

    script = Path(tempfile.mkdtemp(prefix="opgate-replay-")) / "case.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=timeout, env=env, check=False
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc.stdout


def test_forward_replay_fills_the_parameter_block_the_recorder_saw() -> None:
    """rms_norm forward: miss -> Python records, hit -> C++ replays one launch with the same parameters."""
    out = _run(
        """
        from opgate.ops.rms_norm.triton_impl import _rms_norm
        op = define("rms_norm", "rms_norm(Tensor x, Tensor w, float eps) -> Tensor")
        assert replay.attach("opgate_replay_test::rms_norm", _rms_norm, backend_key="CPU", autograd_key="")
        x = torch.randn(64, 4096, dtype=torch.bfloat16)
        w = torch.randn(4096, dtype=torch.bfloat16)
        y0 = op(x, w, 1e-6)                         # miss: recorded in Python
        assert take_log() == []                     # the recording launched nothing through C++
        st = replay.status()["ops"]["opgate_replay_test::rms_norm"]
        assert (st["misses"], st["hits"], st["plans"]) == (1, 0, 1), st
        y = op(x, w, 1e-6)                          # hit: replayed
        log = take_log()
        st = replay.status()["ops"]["opgate_replay_test::rms_norm"]
        assert st["hits"] == 1 and st["python_calls"] == 1, st
        assert y.shape == x.shape and y.dtype == x.dtype and y.is_contiguous()
        with record.Recorder((x, w, 1e-6), offline_target=replay._STATE["offline_target"]) as rec:
            _rms_norm(x, w, 1e-6)
        exp = expected(rec, (x, w, 1e-6), {0: y.data_ptr()})
        assert log == exp, (log, exp)
        la = log[0]
        eps_bits = struct.unpack("<I", struct.pack("<f", 1e-6))[0]
        assert (4, eps_bits) in la["params"]            # eps as an fp32 literal
        assert la["params"][0] == (8, x.data_ptr())     # x_ptr first
        assert la["params"][2] == (8, y.data_ptr())     # y_ptr: the output replay allocated
        assert la["params"][-2:] == [(8, 0), (8, 0)]    # Triton's scratch pointers, null
        print("launch", la["grid"], la["threads"], len(la["params"]))
        """
    )
    assert "launch" in out


def test_backward_plan_buffers_outputs_and_keys() -> None:
    """rms_norm backward: the dw partial buffer is shared by both launches; a new layout is a new key."""
    _run(
        """
        from opgate.ops.rms_norm.triton_impl import _rms_norm_backward
        op = define("rms_bwd", "rms_bwd(Tensor dy, Tensor x, Tensor w, float eps) -> (Tensor, Tensor)")
        replay.attach("opgate_replay_test::rms_bwd", _rms_norm_backward, backend_key="CPU", autograd_key="")
        x = torch.randn(300, 1000, dtype=torch.float16)
        dy = torch.randn_like(x)
        w = torch.randn(1000, dtype=torch.float16)
        op(dy, x, w, 1e-6)
        dx, dw = op(dy, x, w, 1e-6)
        log = take_log()
        assert len(log) == 2, log                    # the persistent backward, then the dw reduction
        ptrs0 = {v for s, v in log[0]["params"] if s == 8}
        ptrs1 = {v for s, v in log[1]["params"] if s == 8}
        shared = (ptrs0 & ptrs1) - {0}
        assert len(shared) == 1, (ptrs0, ptrs1)       # the partial buffer: written, then reduced
        assert dx.data_ptr() in ptrs0 and dw.data_ptr() in ptrs1
        assert dx.shape == x.shape and dw.shape == w.shape and dw.dtype == torch.float16
        xt = torch.randn(1000, 300, dtype=torch.float16).t()   # same shape, transposed strides
        op(dy, xt, w, 1e-6)
        st = replay.status()["ops"]["opgate_replay_test::rms_bwd"]
        assert st["misses"] == 2 and st["plans"] == 2, st
        xm = torch.randn(300 * 1000 + 1, dtype=torch.float16)[1:].view(300, 1000)  # misaligned
        op(dy, xm, w, 1e-6); op(dy, xm, w, 1e-6)
        st = replay.status()["ops"]["opgate_replay_test::rms_bwd"]
        assert st["misses"] == 3 and st["hits"] == 2, st
        op(dy, x, w, 1e-5)                            # another eps is another key
        assert replay.status()["ops"]["opgate_replay_test::rms_bwd"]["misses"] == 4
        """
    )


def test_plan_is_refused_when_the_launcher_writes_with_a_torch_op() -> None:
    """Planted fault: a buffer zeroed by torch.zeros cannot be replayed uninitialised -> Python every call."""
    _run(
        """
        import triton, triton.language as tl
        @triton.jit
        def _acc(x_ptr, o_ptr, n, BLOCK: tl.constexpr):
            i = tl.arange(0, BLOCK)
            tl.atomic_add(o_ptr + i, tl.load(x_ptr + i, mask=i < n), mask=i < n)
        def impl(x):
            out = torch.zeros_like(x)                 # the fault: a write replay would skip
            _acc[(1,)](x, out, x.numel(), BLOCK=1024)
            return out
        op = define("acc", "acc(Tensor x) -> Tensor")
        replay.attach("opgate_replay_test::acc", impl, backend_key="CPU", autograd_key="")
        x = torch.randn(1000)
        for _ in range(3):
            op(x)
        st = replay.status()["ops"]["opgate_replay_test::acc"]
        assert st["hits"] == 0 and st["python_calls"] == 3, st
        assert any(f"aten::{n}" in st["refused"] for n in ("zeros", "zero_", "fill_")), st
        assert take_log() == []
        """
    )


def test_cpp_autograd_formula_passes_gradcheck_and_a_swapped_formula_fails() -> None:
    """The C++ autograd Node, driven by a Formula, passes float64 gradcheck; a swapped formula fails."""
    _run(
        """
        from opgate.ops._replay.formula import Formula
        def fwd(x, w, alpha):  return x * w * alpha
        def bwd(g, x, w, alpha): return g * w * alpha, (g * x * alpha).sum(0)
        for name, grads in (("mulw", (0, 1, None)), ("mulw_bad", (1, 0, None))):
            op = define(name, f"{name}(Tensor x, Tensor w, float alpha) -> Tensor")
            define(f"{name}_bwd", f"{name}_bwd(Tensor g, Tensor x, Tensor w, float a) -> (Tensor, Tensor)")
            args = (("grad", 0), ("input", 0), ("input", 1), ("input", 2))
            f = Formula(f"opgate_replay_test::{name}_bwd", args, grads)
            keys = dict(backend_key="CPU", autograd_key="AutogradCPU")
            replay.attach(f"opgate_replay_test::{name}", fwd, f, **keys)
            replay.attach(f.backward, bwd, **keys)
        x = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
        w = torch.randn(3, dtype=torch.float64, requires_grad=True)
        y = torch.ops.opgate_replay_test.mulw(x, w, 1.5)
        assert y.grad_fn.name() == "opgate_replay_test::mulwBackward", y.grad_fn.name()
        assert torch.autograd.gradcheck(lambda a, b: torch.ops.opgate_replay_test.mulw(a, b, 1.5), (x, w))
        bad = torch.ops.opgate_replay_test.mulw_bad
        try:
            torch.autograd.gradcheck(lambda a, b: bad(a, b, 1.5), (x, w), raise_exception=True)
        except Exception as e:
            print("bad formula caught:", type(e).__name__)
        else:
            raise AssertionError("a swapped formula passed gradcheck")
        # no grad needed: no node; inference only runs the forward
        with torch.no_grad():
            assert torch.ops.opgate_replay_test.mulw(x, w, 1.5).grad_fn is None
        # a backward through the backward op (no formula) raises like custom_op's
        g = torch.ones(5, 3, dtype=torch.float64, requires_grad=True)
        dx, dw = torch.ops.opgate_replay_test.mulw_bwd(g, x, w, 1.5)
        try:
            dx.sum().backward()
        except RuntimeError as e:
            assert "no autograd formula was registered" in str(e), e
        else:
            raise AssertionError("double backward did not raise")
        """
    )


def test_python_errors_cross_the_cpp_kernel_unchanged_and_unsupported_grads_raise() -> None:
    _run(
        """
        from opgate.ops._replay.formula import Formula
        def fwd(x, t):
            if x.shape[-1] != t.shape[-1]:
                raise ValueError(f"bad shapes {tuple(x.shape)} vs {tuple(t.shape)}")
            return x * t
        def bwd(g, t): return g * t
        op = define("rot", "rot(Tensor x, Tensor t) -> Tensor")
        define("rot_bwd", "rot_bwd(Tensor g, Tensor t) -> Tensor")
        f = Formula(
            "opgate_replay_test::rot_bwd", (("grad", 0), ("input", 1)), (0, None),
            unsupported={1: "rot: no gradient for t"},
        )
        replay.attach("opgate_replay_test::rot", fwd, f, backend_key="CPU", autograd_key="AutogradCPU")
        replay.attach(f.backward, bwd, backend_key="CPU", autograd_key="AutogradCPU")
        try:
            op(torch.randn(2, 3), torch.randn(4))
        except ValueError as e:
            assert "bad shapes (2, 3) vs (4,)" in str(e)
        else:
            raise AssertionError("no error")
        t = torch.randn(3, requires_grad=True)
        y = op(torch.randn(2, 3, requires_grad=True), t)
        try:
            y.sum().backward()
        except NotImplementedError as e:
            assert "rot: no gradient for t" in str(e)
        else:
            raise AssertionError("unsupported gradient did not raise")
        """
    )
