"""Profiler evidence: trace parsing, copy classification, and a broken profiler never passing."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from opgate.validators.checks import evidence, observe
from opgate.validators.checks.artifacts import Artifact
from opgate.validators.checks.cell import fresh_compiler_state, poisoned_allocations
from opgate.validators.checks.context import build_context
from opgate.validators.profiling import Event, Trace, match, parse_chrome_trace, profile_call
from opgate.validators.result import Verdict
from tests.zoo.harness import make_cell, run, specs


def op_event(name: str, types: list[str], dims: list[Any], ext: int | None = None) -> dict[str, Any]:
    args: dict[str, Any] = {"Input type": types, "Input Dims": dims}
    if ext is not None:
        args["External id"] = ext
    return {"ph": "X", "cat": "cpu_op", "name": name, "ts": 0, "dur": 1, "args": args}


def write_trace(tmp_path: Path, events: list[dict[str, Any]]) -> Path:
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def test_parse_splits_host_events_and_kernels_and_lists_copies(tmp_path: Path) -> None:
    events = [
        op_event("my::op", ["c10::BFloat16"], [[4, 8]], ext=1),
        op_event("aten::copy_", ["c10::BFloat16", "c10::BFloat16", "Scalar"], [[4, 8], [4, 8], []], ext=2),
        op_event("aten::copy_", ["float", "c10::BFloat16", "Scalar"], [[4, 8], [4, 8], []], ext=3),  # a cast
        op_event("aten::copy_", ["unsigned char", "unsigned char", "Scalar"], [[8, 8], [8, 8], []], ext=4),
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "opgate-harness::triton-interpreter",
            "ts": 10,
            "dur": 5,
        },
        {**op_event("aten::copy_", ["unsigned char", "unsigned char", "Scalar"], [[64], [64], []]), "ts": 11},
        {"ph": "X", "cat": "user_annotation", "name": "graph_0_cpp_fused_clone_0", "args": {}},
        {"ph": "X", "cat": "kernel", "name": "_my_kernel", "args": {"External id": 1}},
        {"ph": "X", "cat": "kernel", "name": "elementwise_kernel<direct_copy>", "args": {"External id": 2}},
        {"ph": "i", "cat": "cpu_op", "name": "instant, ignored"},
        {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)"},
    ]
    trace = parse_chrome_trace(write_trace(tmp_path, events))
    assert trace.names("cpu") == ["my::op", "aten::copy_", "graph_0_cpp_fused_clone_0"]
    assert trace.names("cuda") == ["_my_kernel", "elementwise_kernel<direct_copy>"]
    assert trace.copies() == [
        "aten::copy_ c10::BFloat16[4, 8] <- c10::BFloat16[4, 8] [elementwise_kernel<direct_copy>]",
        "aten::copy_ unsigned char[8, 8] <- unsigned char[8, 8]",  # quantised codes count too
        "graph_0_cpp_fused_clone_0",
    ]
    assert [e.name for e in trace.harness] == ["opgate-harness::triton-interpreter", "aten::copy_"]


def test_empty_trace_is_empty() -> None:
    assert Trace().empty
    assert not Trace(host=[Event("x", "cpu_op")]).empty


def test_match_is_case_sensitive_glob_with_alternatives() -> None:
    names = ["opgate::rms_norm", "aten::mm", "aten::addmm"]
    assert match(names, ["opgate::*", "ATEN::*", "aten::bmm|aten::*add*"]) == {
        "opgate::*": ["opgate::rms_norm"],
        "ATEN::*": [],
        "aten::bmm|aten::*add*": ["aten::addmm"],
    }


def test_real_profile_counts_a_contiguous_copy_but_not_a_cast(tmp_path: Path) -> None:
    x = torch.randn(64, 32, dtype=torch.bfloat16).t()
    copy_trace, _ = profile_call(x.contiguous, "cpu", tmp_path / "copy.json")
    assert len(copy_trace.copies()) == 1
    assert "aten::contiguous" in copy_trace.names("cpu")
    cast_trace, _ = profile_call(x.float, "cpu", tmp_path / "cast.json")
    assert cast_trace.copies() == []
    assert (tmp_path / "cast.json").is_file()


def _context(tmp_path: Path, op: str = "zoo_good", layout: str = "contiguous", device: str = "cpu") -> Any:
    spec = specs()[op]
    ctx = build_context(make_cell(op, "fp32", layout, "eager"), spec, "cpu", 7, tmp_path)
    if device != "cpu":  # pretend: inputs stay on CPU, the evidence rules of `device` apply
        on_cpu = ctx.sample_fn
        ctx = dataclasses.replace(ctx, device=device, sample_fn=lambda s, d, _dev, g: on_cpu(s, d, "cpu", g))
    ctx.artifact = Artifact(ctx.op)
    return ctx


def test_triton_interpreter_storage_copies_are_not_hidden_copies(tmp_path: Path) -> None:
    ctx = _context(tmp_path)
    sample = ctx.inputs()[0]
    ctx.op(*sample.args, **sample.kwargs)
    trace, _ = profile_call(lambda: ctx.op(*sample.args, **sample.kwargs), "cpu", tmp_path / "t.json")
    assert "zoo::good_rms_norm" in trace.names("cpu")
    # the interpreter moves arguments through byte storages, inside the launch's harness range
    assert "aten::copy_" in [e.name for e in trace.harness]
    assert trace.copies() == []


def test_profiler_with_no_events_is_an_error_never_a_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for module in (evidence, observe):
        monkeypatch.setattr(module, "profile_call", lambda fn, kind, path: (Trace(path=path), fn()))
    with fresh_compiler_state(cpu=True), poisoned_allocations():
        result = evidence.run(_context(tmp_path))
    assert result.status is Verdict.ERROR
    assert result.summary == "profiler recorded no events"


def test_cuda_trace_without_kernels_is_an_error_unless_the_input_is_empty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host_only = [Event("zoo::good_rms_norm", "cpu_op")]
    for module in (evidence, observe):
        monkeypatch.setattr(
            module, "profile_call", lambda fn, kind, path: (Trace(host=list(host_only), path=path), fn())
        )
    with fresh_compiler_state(cpu=True), poisoned_allocations():
        broken = evidence.run(_context(tmp_path, device="cuda:0"))
        empty = evidence.run(_context(tmp_path, layout="zero_size", device="cuda:0"))
    assert broken.status is Verdict.ERROR
    assert "no GPU kernel" in broken.summary
    assert empty.status is Verdict.PASS  # nothing to launch for an empty batch; forbid still checked
    assert empty.details["empty_input"] is True


def test_evidence_names_the_kernels_in_the_outcome(tmp_path: Path) -> None:
    verdict, outcome = run(make_cell("zoo_good", "fp16", "contiguous", "eager"), tmp_path)
    assert verdict is Verdict.PASS
    assert "zoo::good_rms_norm" in outcome.kernels
    ev = next(c for c in outcome.checks if c.name == "evidence")
    assert Path(ev.details["trace"]).is_file()


def test_witness_sees_tensor_only_custom_ops_and_not_decompositions() -> None:
    """torch 2.14's profiler drops Tensor-only custom ops; the body witness must not."""
    import torch

    from opgate.validators.witness import executed_custom_ops

    lib = torch.library.Library("opgate_dispatch_test", "FRAGMENT")
    lib.define("decomposed(Tensor a) -> Tensor")
    lib.impl("decomposed", lambda a: a * 2, "CompositeImplicitAutograd")

    @torch.library.custom_op("opgate_dispatch_test::opaque", mutates_args=())
    def opaque(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b

    a = torch.randn(4)
    names = ["opgate_dispatch_test::opaque", "opgate_dispatch_test::decomposed"]
    assert executed_custom_ops(lambda: opaque(a, a), names)[0] == "opgate_dispatch_test::opaque"
    ran = executed_custom_ops(lambda: torch.ops.opgate_dispatch_test.decomposed(a), names)
    assert "opgate_dispatch_test::decomposed" not in ran


@pytest.mark.integration
def test_executed_custom_ops_witnesses_the_body_inside_a_compiled_program() -> None:
    import torch

    from opgate.validators.witness import executed_custom_ops

    @torch.library.custom_op("opgate_exec_test::double", mutates_args=())
    def double(a: torch.Tensor) -> torch.Tensor:
        return a * 2

    @double.register_fake
    def _(a: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(a)

    compiled = torch.compile(lambda t: double(t) + 1, fullgraph=True)
    a = torch.randn(8)
    compiled(a)
    assert executed_custom_ops(lambda: compiled(a), ["opgate_exec_test::double"]) == [
        "opgate_exec_test::double"
    ]
    inlined = torch.compile(lambda t: t * 2 + 1, fullgraph=True)
    inlined(a)
    assert executed_custom_ops(lambda: inlined(a), ["opgate_exec_test::double"]) == []


def test_inductor_realignment_copies_are_told_apart_from_hidden_copies() -> None:
    """A compiled graph served for aligned inputs copies a misaligned one: the compile path's cost."""
    import torch

    from opgate.ops.base import SampleInput
    from opgate.validators.checks.evidence import misaligned_spans, realignment_copies
    from opgate.validators.layouts import misaligned

    x = misaligned(torch.randn(67, 1000, dtype=torch.bfloat16))
    w = torch.randn(1000, dtype=torch.bfloat16)
    sample = SampleInput(args=(x, w), kwargs={"eps": 1e-6})
    assert misaligned_spans(sample) == []  # CPU inputs: Inductor realigns GPU inputs only
    spans = misaligned_spans(sample, gpu_only=False)
    assert spans == [67000]
    realign = "aten::copy_ c10::BFloat16[67000] <- c10::BFloat16[67000]"
    hidden = "aten::copy_ c10::BFloat16[67, 1000] <- c10::BFloat16[67, 1000]"
    assert realignment_copies([realign, hidden], spans) == [realign]
    assert realignment_copies([realign, realign], spans) == [realign]  # one per misaligned input
    assert realignment_copies([hidden], spans) == []
