"""Evidence in every mode: graph replays, harness ranges, the op's graph, fake vs real metadata, hints."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from opgate.validators.checks import evidence, fakemeta, observe, opcheck, sass
from opgate.validators.checks.artifacts import Artifact
from opgate.validators.checks.base import describe_exception
from opgate.validators.checks.cell import fresh_compiler_state, poisoned_allocations, unchecked_evidence
from opgate.validators.checks.context import build_context
from opgate.validators.checks.opgraph import context_kernel_matcher, is_plain, run_eagerly
from opgate.validators.profiling import graph_copies, parse_chrome_trace, profile_call
from opgate.validators.result import CheckResult, Verdict
from tests.zoo.harness import make_cell, run, specs


def _x(name: str, cat: str, ts: float, dur: float, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1, "args": args}


def _replay_trace(tmp_path: Path) -> Path:
    """A CUDA-graph replay as kineto writes it: graph kernels carry the graph launch's correlation."""
    events = [
        _x("aten::_foreach_copy_", "cpu_op", 0, 5, **{"External id": 1}),  # the tree's input copy
        _x("multi_tensor_apply_kernel<copy>", "kernel", 0, 1, correlation=3, **{"External id": 1}),
        _x("cudaGraphLaunch", "cuda_runtime", 6, 1, correlation=7),
        _x("triton_poi_fused_neg_0", "kernel", 7, 1, correlation=7),
        _x("elementwise_kernel<direct_copy_bf16>", "kernel", 8, 1, correlation=7),
        _x("_zoo_rms_fwd_kernel", "kernel", 9, 1, correlation=7),
        _x("Memcpy DtoD (Device -> Device)", "gpu_memcpy", 10, 1, correlation=7),
        _x("later_graph_kernel", "kernel", 11, 1, correlation=99, **{"graph id": 4}),  # newer kineto
        _x("opgate-harness::cudagraph-outputs", "user_annotation", 20, 10),
        _x("aten::clone", "cpu_op", 21, 5, **{"External id": 2}),
        _x("aten::copy_", "cpu_op", 22, 3, **{"Input type": ["float", "float"], "External id": 3}),
        _x("elementwise_kernel<direct_copy_bf16>", "kernel", 23, 1, correlation=9, **{"External id": 3}),
    ]
    path = tmp_path / "replay.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def test_replay_kernels_are_the_graph_and_harness_work_is_set_aside(tmp_path: Path) -> None:
    trace = parse_chrome_trace(_replay_trace(tmp_path))
    assert [k.name for k in trace.graph_kernels()] == [
        "triton_poi_fused_neg_0",
        "elementwise_kernel<direct_copy_bf16>",
        "_zoo_rms_fwd_kernel",
        "later_graph_kernel",
    ]
    # opgate's output clone (inside a harness range) is neither a host event nor a kernel of the op
    assert "aten::clone" not in trace.names("cpu")
    assert trace.copies() == []
    assert sum(k.name.startswith("elementwise") for k in trace.kernels) == 1
    copies = graph_copies(trace, frozenset({"elementwise_kernel<direct_copy_bf16>"}))
    assert copies == ["elementwise_kernel<direct_copy_bf16> (in the CUDA graph)"]


def _cuda_context(tmp_path: Path, mode: str, layout: str = "contiguous") -> Any:
    """A CPU context that applies the cuda evidence rules (the profiler is replaced by a fixture)."""
    spec = specs()["zoo_good"]
    ctx = build_context(make_cell("zoo_good", "fp32", layout, mode), spec, "cpu", 7, tmp_path)
    on_cpu = ctx.sample_fn
    ctx = dataclasses.replace(ctx, device="cuda:0", sample_fn=lambda s, d, _dev, g: on_cpu(s, d, "cpu", g))
    ctx.artifact = Artifact(ctx.op)
    return ctx


def _fixture_profiler(monkeypatch: pytest.MonkeyPatch, traces: dict[str, Path]) -> None:
    def fake_profile(fn: Any, kind: str, path: Path) -> tuple[Any, Any]:
        out = fn()
        key = next((k for k in traces if k in path.name), "ref")
        return parse_chrome_trace(traces[key]), out

    monkeypatch.setattr(observe, "profile_call", fake_profile)
    monkeypatch.setattr(evidence, "profile_call", fake_profile)


def test_cudagraphs_evidence_reads_the_graph_and_counts_its_copies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    eager = tmp_path / "eager.json"
    eager.write_text(
        json.dumps(
            {
                "traceEvents": [
                    _x(
                        "aten::copy_",
                        "cpu_op",
                        0,
                        2,
                        **{"Input type": ["c10::BFloat16"] * 2, "External id": 5},
                    ),
                    _x("elementwise_kernel<direct_copy_bf16>", "kernel", 0, 1, **{"External id": 5}),
                ]
            }
        )
    )
    ref = tmp_path / "ref.json"
    ref.write_text(json.dumps({"traceEvents": [_x("aten::mul", "cpu_op", 0, 1)]}))
    _fixture_profiler(monkeypatch, {"eager-copies": eager, "-op.": _replay_trace(tmp_path), "ref": ref})
    with fresh_compiler_state(cpu=True), poisoned_allocations():
        result = evidence.run(_cuda_context(tmp_path, "cudagraphs"))
    assert result.status is Verdict.FALLBACK, result.summary
    assert "1 hidden copy" in result.summary
    assert "(in the CUDA graph)" in result.summary
    assert result.details["seen"] == [
        "elementwise_kernel<direct_copy_bf16>",
        "_zoo_rms_fwd_kernel",
        "later_graph_kernel",
    ]
    assert result.details["context"] == ["triton_poi_fused_neg_0"]
    assert result.details["outside_graph"] == ["multi_tensor_apply_kernel<copy>"]


def test_a_cudagraphs_call_that_replays_no_graph_is_a_fallback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({"traceEvents": [_x("_zoo_rms_fwd_kernel", "kernel", 0, 1, correlation=3)]}))
    _fixture_profiler(monkeypatch, {"-op.": plain, "ref": plain})
    with fresh_compiler_state(cpu=True), poisoned_allocations():
        result = evidence.run(_cuda_context(tmp_path, "cudagraphs"))
    assert result.status is Verdict.FALLBACK
    assert "no kernel ran from a CUDA graph" in result.summary
    # the same trace in a compile cell is the op's kernel: pass
    with fresh_compiler_state(cpu=True), poisoned_allocations():
        compiled = evidence.run(_cuda_context(tmp_path, "compile"))
    assert compiled.status is Verdict.PASS, compiled.summary


def test_zero_size_waives_expect_only_when_nothing_launched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    quiet = tmp_path / "quiet.json"
    quiet.write_text(json.dumps({"traceEvents": [_x("aten::empty", "cpu_op", 0, 1)]}))
    busy = tmp_path / "busy.json"
    busy.write_text(json.dumps({"traceEvents": [_x("triton_red_fused_mean_0", "kernel", 0, 1)]}))
    for trace, status in ((quiet, Verdict.PASS), (busy, Verdict.FALLBACK)):
        _fixture_profiler(monkeypatch, {"-op.": trace, "ref": quiet})
        with fresh_compiler_state(cpu=True), poisoned_allocations():
            result = evidence.run(_cuda_context(tmp_path, "eager", layout="zero_size"))
        assert result.status is status, result.summary
    assert "the input is empty, but the op ran other work" in result.summary
    assert evidence.launched_nothing(["aten::empty", "aten::view"], "cpu")
    assert not evidence.launched_nothing(["aten::empty", "aten::mul"], "cpu")
    # compiled graphs on an empty input: Inductor's kernels work on the op's other arguments
    liger_rope = ["triton_poi_fused_neg_unsqueeze_0"]
    assert evidence.launched_nothing(liger_rope, "cuda", "compile")
    assert not evidence.launched_nothing(liger_rope, "cuda", "eager")
    assert not evidence.launched_nothing(
        [*liger_rope, "void at::native::elementwise_kernel"], "cuda", "compile"
    )


def test_uint8_copies_count_but_the_interpreters_byte_copies_do_not(tmp_path: Path) -> None:
    codes = torch.randint(0, 255, (64, 32), dtype=torch.uint8).t()
    trace, _ = profile_call(codes.contiguous, "cpu", tmp_path / "codes.json")
    assert trace.copies() == ["aten::copy_ unsigned char[32, 64] <- unsigned char[32, 64]"]
    verdict, outcome = run(make_cell("zoo_good", "fp32", "contiguous", "eager"), tmp_path)
    ev = next(c for c in outcome.checks if c.name == "evidence")
    assert verdict is Verdict.PASS
    assert ev.details["copies"] == []


def test_context_kernels_are_told_from_the_ops_work() -> None:
    is_context = context_kernel_matcher("zoo::good_rms_norm")
    assert is_context("graph_0_cpp_fused_good_rms_norm_neg_0")
    assert is_context("triton_poi_fused_neg_1")
    assert is_context("triton_poi_fused_neg_triton_kernel_wrapper_functional_0")
    # a decomposition fused with the producer is the op's (vanished) work, not the context
    assert not is_context("graph_1_cpp_fused__to_copy_add_mean_mul_neg_pow_rsqrt_0")
    assert not is_context("triton_red_fused_neg_pow_0")
    assert not context_kernel_matcher("zoo::silu_mul")("triton_poi_fused_mul_neg_silu_0")


def zoo_reference(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def test_the_reference_through_the_context_is_the_reference_exactly() -> None:
    x = torch.randn(67, 100, dtype=torch.bfloat16)
    x[3, 4] = float("nan")
    w = torch.randn(100, dtype=torch.bfloat16)
    assert is_plain(x)
    assert not is_plain(x.t())
    assert not is_plain(x[:, 1:])
    out, consumed = run_eagerly(zoo_reference)(x, w, 1e-6)
    plain = zoo_reference(x, w, 1e-6)
    assert torch.equal(out.isnan(), plain.isnan())  # NaN (an unwritten element) stays NaN
    assert torch.equal(out.nan_to_num(), plain.nan_to_num())
    assert torch.equal(consumed.nan_to_num(), -plain.nan_to_num())


def test_fake_meta_names_the_output_and_what_differs() -> None:
    t = torch.empty(4, 6)
    assert fakemeta.mismatches(t, torch.empty(4, 6)) == []
    assert fakemeta.mismatches(t.to(torch.bfloat16), t) == [
        "output dtype: the fake impl says torch.bfloat16, the kernel returns torch.float32"
    ]
    assert fakemeta.mismatches((t, t.t()), (t, t.t().contiguous())) == [
        "output[1] strides: the fake impl says (1, 6), the kernel returns (4, 1)"
    ]
    assert fakemeta.mismatches(torch.empty(1, 6), torch.empty(6, 1).t()) == []  # size-1 dims: any stride
    assert "outputs:" in fakemeta.mismatches((t,), (t, t))[0]


@pytest.mark.integration
def test_without_fake_meta_the_ops_graph_still_trips_on_the_lie(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The consumer Inductor generates checks the strides the fake promised; PyTorch's hint survives."""
    monkeypatch.setenv("OPGATE_SKIP_CHECKS", "fakemeta")
    verdict, outcome = run(make_cell("zoo_fake_strides", "fp32", "transposed", "compile"), tmp_path)
    assert verdict is Verdict.ERROR, outcome.reason
    correctness = next(c for c in outcome.checks if c.name == "correctness")
    assert "stride 1==67" in correctness.summary
    assert "incorrect fake (aka meta) kernel" in correctness.summary


def test_describe_exception_keeps_pytorchs_explanation_hint_and_cause() -> None:
    try:
        try:
            raise RuntimeError("There was no fake impl registered for <op>. Please use `register_fake`.")
        except RuntimeError as inner:
            message = (
                "RuntimeError when making fake tensor call\n  Explanation: Dynamo failed to run FX node\n"
                "  Hint: check eager\n\n  Developer debug context: \n\n"
                'from user code:\n   File "a.py", line 3\n'
            )
            raise ValueError(message) from inner
    except ValueError as exc:
        text = describe_exception(exc)
    assert text == (
        "ValueError: RuntimeError when making fake tensor call (caused by RuntimeError: There was no fake "
        "impl registered for <op>. Please use `register_fake`.); Explanation: Dynamo failed to run FX node; "
        "Hint: check eager"
    )
    assert len(describe_exception(ValueError("x" * 5000))) == 900


def test_opcheck_picks_the_overload_a_call_dispatches_to(tmp_path: Path) -> None:
    lib = torch.library.Library("opgate_overloads", "DEF")
    lib.define("twice(Tensor x) -> Tensor")
    lib.define("twice.out(Tensor x, *, Tensor(a!) out) -> Tensor(a!)")
    lib.impl("twice", lambda x: x * 2, "CompositeExplicitAutograd")
    lib.impl("twice.out", lambda x, *, out: out.copy_(x * 2), "CompositeExplicitAutograd")
    x = torch.randn(3)
    op = opcheck.lookup("opgate_overloads::twice", (x,), {})
    assert op is torch.ops.opgate_overloads.twice.default
    assert opcheck.lookup("opgate_overloads::twice.out") is torch.ops.opgate_overloads.twice.out
    assert torch.library.opcheck(op, (x,), test_utils=("test_schema",))["test_schema"] == "SUCCESS"


def test_sass_skip_reason_names_the_kind(tmp_path: Path) -> None:
    ctx = _cuda_context(tmp_path, "eager")
    external = dataclasses.replace(ctx, impl=dataclasses.replace(ctx.impl, kind="external"))
    assert "Triton" not in (sass.applies(external) or "")
    assert "names no binaries" in (sass.applies(external) or "")
    assert "Triton" in (sass.applies(ctx) or "")


def test_a_gpu_cell_without_checked_evidence_is_never_pass() -> None:
    ok = [CheckResult("correctness", Verdict.PASS)]
    skipped = [
        *ok,
        CheckResult("evidence", Verdict.SKIP, "the spec declares no cuda evidence for mode eager"),
    ]
    assert unchecked_evidence(ok, "cpu", "eager") is None
    assert unchecked_evidence([*ok, CheckResult("evidence", Verdict.PASS)], "cuda:0", "eager") is None
    for results in (ok, skipped):
        guard = unchecked_evidence(results, "cuda:0", "export")
        assert guard is not None
        assert guard.status is Verdict.ERROR
        assert "never pass" in guard.summary
    assert (
        unchecked_evidence([CheckResult("correctness", Verdict.FAIL), *skipped[1:]], "cuda:0", "eager")
        is None
    )


PY_OP_MODULE = """
import torch

from opgate.ops.base import SampleInput, randn

CALLS = []


def reference(x):
    return torch.tanh(x)


def op(x):
    from torch._subclasses.fake_tensor import FakeTensor

    CALLS.append(isinstance(x, FakeTensor))  # a Triton launch here would read a fake pointer
    return torch.tanh(x)


def samples(shape, dtype, device, generator):
    return SampleInput(args=(randn(tuple(shape), dtype, device, generator),), grad_args=())
"""

PY_OP_SPEC = """
spec_version: 1
op: py_tanh
summary: "a plain Python function, as Liger's ops are"
category: activation
reference: opgate_py_op:reference
samples: opgate_py_op:samples
shapes: {default: [[4, 8]]}
dtypes: [fp32]
layouts: [contiguous]
modes: [eager, compile]
tolerance: {k: 2.0, atol_floor: 1.0e-5}
implementations:
  py:
    kind: external
    entry: opgate_py_op:op
    evidence: {cpu: {expect: ["aten::tanh"]}, cuda: {expect: ["*tanh*"]}}
"""


@pytest.mark.integration
@pytest.mark.parametrize("mode", ["eager", "compile"])
def test_a_plain_python_op_is_never_called_on_fake_tensors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """On a GPU its kernels would launch on fake tensors' null pointers: an illegal memory access."""
    import sys

    from opgate.matrix.spec import load_spec
    from opgate.validators.checks import run_cell

    (tmp_path / "opgate_py_op.py").write_text(PY_OP_MODULE)
    (tmp_path / "py_tanh").mkdir()
    (tmp_path / "py_tanh" / "spec.yaml").write_text(PY_OP_SPEC)
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = load_spec(tmp_path / "py_tanh" / "spec.yaml", tmp_path)
    cell = dataclasses.replace(make_cell("py_tanh", "fp32", "contiguous", mode), impl="py")
    out = run_cell(cell, spec, "cpu", 1, tmp_path / "work")
    check = next(c for c in out.checks if c.name == "fake_meta")
    assert check.status is Verdict.SKIP
    assert "not a torch.library op" in check.summary
    calls = sys.modules["opgate_py_op"].CALLS
    assert calls  # the op ran ...
    assert not any(calls), calls  # ... never on a FakeTensor outside a tracer
    assert all(c.status in (Verdict.PASS, Verdict.SKIP) for c in out.checks), out.checks
