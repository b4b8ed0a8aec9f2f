"""``torch.library.triton_op`` ops on CPU: the documented registration runs under the interpreter.

Without :func:`validators.interpreted_triton_op.support_triton_ops`, tracing a
``triton_op`` op on CPU launches Triton's interpreter on FakeTensors and every
compile/export cell fails (reproduced here in a clean subprocess); the failure
reason must still carry PyTorch's actionable cause, not only Dynamo's wrapper
line.  With it, fake launches are no-ops (what ``wrap_triton``'s higher-order
op does under FakeTensorMode) and real launches run unchanged.  The zoo's
``zoo_triton_op`` cases (tests/zoo_cases.py) pass every mode end to end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.zoo.harness import ZOO, make_cell, run

REPO = Path(__file__).resolve().parent.parent

_UNPATCHED = f"""
import json, os, sys
os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, {str(ZOO)!r})
import torch
from zoo_ops.triton_op import rms_norm
from opgate.validators.checks.base import describe_exception
x, w = torch.randn(8, 64), torch.randn(64)
out = {{"eager_ok": bool(torch.allclose(rms_norm(x, w), rms_norm(x, w)))}}
try:
    torch.compile(rms_norm, fullgraph=True)(x, w)
    out["compile"] = "ran"
except Exception as exc:
    out["compile"] = describe_exception(exc)
print(json.dumps(out))
"""


@pytest.mark.slow
def test_without_support_compile_fails_and_the_reason_keeps_pytorchs_hint() -> None:
    """The bug is real (in a process without the validators' support), and its reason names the fix."""
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [sys.executable, "-c", _UNPATCHED],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["eager_ok"]
    reason = out["compile"]
    assert reason.startswith("TorchRuntimeError: RuntimeError when making fake tensor call"), reason
    assert "caused by RuntimeError: Cannot access data pointer of Tensor" in reason, reason


def test_fake_launches_are_noops_and_real_launches_run() -> None:
    """Under FakeTensorMode the body allocates and skips the kernel; on real tensors the kernel writes."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from opgate.validators.interpreted_triton_op import support_triton_ops

    assert support_triton_ops()  # the harness runs with TRITON_INTERPRET=1, as a CPU worker does
    if str(ZOO) not in sys.path:
        sys.path.insert(0, str(ZOO))
    from zoo_ops.reference import rms_norm as reference
    from zoo_ops.triton_op import rms_norm

    x, w = torch.randn(5, 33), torch.randn(33)
    torch.testing.assert_close(rms_norm(x, w), reference(x, w))
    with FakeTensorMode() as mode:
        fx, fw = mode.from_tensor(x), mode.from_tensor(w)
        y = rms_norm(fx, fw)
    assert y.shape == (5, 33)
    assert y.dtype == torch.float32
    result = torch.library.opcheck(rms_norm, (x, w), raise_exception=False)
    assert all(v == "SUCCESS" for v in result.values()), result


@pytest.mark.slow
def test_compile_serves_every_shape_with_one_graph(tmp_path: Path) -> None:
    """Fixed block sizes specialize nothing: the second shape reuses the graph (dynamic_shapes holds)."""
    _, outcome = run(make_cell("zoo_triton_op", "fp32", "contiguous", "compile"), tmp_path)
    compile_check = next(c for c in outcome.checks if c.name == "compile")
    assert compile_check.status.value == "pass", compile_check.summary
    assert compile_check.details["recompiles"] == 0
    evidence = next(c for c in outcome.checks if c.name == "evidence")
    assert "zoo::triton_op_rms_norm" in evidence.details["seen"]
