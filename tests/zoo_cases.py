"""The planted-fault zoo's verdict table, and how a test runs one of its cells.

Each case runs a real cell through ``validators.checks.run_cell`` in-process
(as the worker does).  For every fault the table holds cells it must affect
*and* cells it must not (those must pass): a check that flags everything, or
nothing, fails.  ``zoo_good`` shares the faulty ops' kernel and must pass
every cell it is given.  The CPU cases run in ``tests/test_zoo.py`` (eager),
``tests/test_zoo_compile.py`` (compile) and ``tests/test_zoo_export.py`` (export,
aoti): three files, so that pytest-xdist can run them side by side; the GPU
ones through ``.ci/gpu`` step zoo (``tests/zoo/gpu_cases.py``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from opgate.matrix.cell import Cell
from opgate.validators.checks import CellOutcome
from opgate.validators.result import CheckResult, Verdict
from tests.zoo.harness import make_cell, run

#: The seed of every verdict case (the stability cases add two more).
SEED = 20260


@dataclass(frozen=True)
class Case:
    op: str
    dtype: str
    layout: str
    mode: str
    verdict: str = "pass"
    check: str | None = None  # the check that must report ``verdict`` itself
    impl: str = "triton"
    shapes: str = "default"
    #: "cpu" or "gpu" for a case that holds on one kind of device only (cudagraphs cells: GPU)
    only: str = ""

    @property
    def device(self) -> str:
        return "gpu" if self.mode == "cudagraphs" else self.only

    def cell(self) -> Cell:
        return make_cell(self.op, self.dtype, self.layout, self.mode, impl=self.impl, shapes=self.shapes)

    @property
    def cell_id(self) -> str:
        return self.cell().id


def ok(op: str, dtype: str, layout: str, mode: str, **kw: str) -> Case:
    return Case(op, dtype, layout, mode, **kw)


CASES = [
    # control: the same kernel, nothing planted -> no false alarms, any dtype, layout or mode
    ok("zoo_good", "fp32", "contiguous", "eager"),
    ok("zoo_good", "bf16", "transposed", "eager"),
    ok("zoo_good", "fp16", "strided", "compile"),
    ok("zoo_good", "bf16", "offset", "compile"),
    ok("zoo_good", "fp32", "broadcast", "eager"),
    ok("zoo_good", "fp16", "misaligned", "eager"),
    ok("zoo_good", "bf16", "zero_size", "compile"),
    ok("zoo_good", "bf16", "strided", "export"),
    ok("zoo_good", "fp32", "contiguous", "aoti"),
    # CompositeImplicitAutograd: kernel runs eagerly, vanishes under compile (opcheck is blind to it)
    ok("zoo_cia", "fp32", "contiguous", "eager"),
    ok("zoo_cia", "bf16", "transposed", "eager"),
    Case("zoo_cia", "fp32", "contiguous", "compile", "fallback", "evidence"),
    Case("zoo_cia", "bf16", "transposed", "compile", "fallback", "evidence"),
    Case("zoo_cia", "fp32", "contiguous", "aoti", "fallback", "evidence"),  # the loaded package's run
    # no fake impl: eager numbers fine, but opcheck and every tracing mode fail
    Case("zoo_no_fake", "fp32", "contiguous", "eager", "fail", "opcheck:test_faketensor"),
    Case("zoo_no_fake", "fp32", "contiguous", "compile", "fail", "compile"),
    Case("zoo_no_fake", "bf16", "strided", "export", "fail", "export"),
    # hidden .contiguous(): fallback exactly where the input is not contiguous
    Case("zoo_hidden_copy", "bf16", "transposed", "eager", "fallback", "evidence"),
    Case("zoo_hidden_copy", "fp32", "strided", "compile", "fallback", "evidence"),
    Case("zoo_hidden_copy", "fp16", "broadcast", "eager", "fallback", "evidence"),
    ok("zoo_hidden_copy", "fp32", "contiguous", "eager"),
    ok("zoo_hidden_copy", "bf16", "offset", "compile"),
    ok("zoo_hidden_copy", "fp16", "misaligned", "eager"),
    # ignores strides: wrong numbers on every strided view, right on every contiguous one
    Case("zoo_ignores_strides", "fp32", "transposed", "eager", "fail", "correctness"),
    Case("zoo_ignores_strides", "bf16", "strided", "compile", "fail", "correctness"),
    Case("zoo_ignores_strides", "fp16", "broadcast", "export", "fail", "correctness"),
    ok("zoo_ignores_strides", "fp32", "offset", "compile"),
    ok("zoo_ignores_strides", "bf16", "misaligned", "eager"),
    ok("zoo_ignores_strides", "fp16", "zero_size", "eager"),
    # ignores the storage offset: wrong exactly on the offset and misaligned layouts
    Case("zoo_ignores_offset", "fp32", "offset", "eager", "fail", "correctness"),
    Case("zoo_ignores_offset", "bf16", "misaligned", "compile", "fail", "correctness"),
    ok("zoo_ignores_offset", "fp16", "transposed", "eager"),
    ok("zoo_ignores_offset", "fp32", "strided", "compile"),
    ok("zoo_ignores_offset", "bf16", "contiguous", "export"),
    # bf16 accumulation: wrong in bf16 on wide rows; fp32/fp16 accumulate in float32
    Case("zoo_bf16_accum", "bf16", "contiguous", "eager", "fail", "correctness"),
    Case("zoo_bf16_accum", "bf16", "transposed", "compile", "fail", "correctness"),
    ok("zoo_bf16_accum", "fp16", "contiguous", "eager"),
    ok("zoo_bf16_accum", "fp32", "strided", "compile"),
    # wrong backward: only the gradient checks see it; forward-only modes pass
    Case("zoo_wrong_backward", "fp32", "contiguous", "eager", "fail", "gradients"),
    Case("zoo_wrong_backward", "bf16", "transposed", "eager", "fail", "gradients"),
    ok("zoo_wrong_backward", "fp32", "contiguous", "compile"),
    ok("zoo_wrong_backward", "bf16", "offset", "export"),
    # fp16 silently routed to aten: fallback in fp16 only
    Case("zoo_routes_fp16", "fp16", "contiguous", "eager", "fallback", "evidence"),
    Case("zoo_routes_fp16", "fp16", "transposed", "compile", "fallback", "evidence"),
    ok("zoo_routes_fp16", "bf16", "contiguous", "eager"),
    ok("zoo_routes_fp16", "fp32", "transposed", "compile"),
    # crashes on an empty batch: error in zero_size cells only
    Case("zoo_zero_size_crash", "fp32", "zero_size", "eager", "error", "correctness"),
    Case("zoo_zero_size_crash", "bf16", "zero_size", "compile", "error", "correctness"),
    ok("zoo_zero_size_crash", "fp32", "contiguous", "eager"),
    ok("zoo_zero_size_crash", "bf16", "transposed", "compile"),
    # unwritten tail rows: caught as NaN thanks to poisoned allocations; M % 4 == 0 passes
    Case("zoo_tail_unwritten", "fp32", "contiguous", "eager", "fail", "correctness"),
    Case("zoo_tail_unwritten", "bf16", "strided", "compile", "fail", "correctness"),
    ok("zoo_tail_unwritten", "fp32", "contiguous", "eager", shapes="aligned"),
    ok("zoo_tail_unwritten", "fp16", "zero_size", "eager"),
    # fake impl specializes a size: recompiles for a second shape although dynamic shapes are declared
    Case("zoo_specializes", "fp32", "contiguous", "compile", "fail", "compile"),
    ok("zoo_specializes", "bf16", "transposed", "eager"),
    # data-dependent Python in the entry point: fullgraph fails (a plain compile counts one break)
    Case("zoo_graph_break", "fp32", "contiguous", "compile", "fail", "compile"),
    ok("zoo_graph_break", "fp16", "strided", "eager"),
    # torch.library.triton_op + wrap_triton (PyTorch's documented path): passes every mode, CPU included
    ok("zoo_triton_op", "fp32", "contiguous", "eager"),
    ok("zoo_triton_op", "bf16", "transposed", "eager"),
    ok("zoo_triton_op", "fp16", "strided", "compile"),
    ok("zoo_triton_op", "bf16", "zero_size", "compile"),
    ok("zoo_triton_op", "fp32", "offset", "export"),
    ok("zoo_triton_op", "fp32", "contiguous", "aoti"),
    # declared limits
    Case("zoo_limits", "fp16", "contiguous", "eager", "unsupported", "limits", impl="refuses"),
    Case("zoo_limits", "fp16", "transposed", "compile", "unsupported", "limits", impl="refuses"),
    Case("zoo_limits", "fp16", "contiguous", "eager", "fail", "limits", impl="works"),
    Case("zoo_limits", "fp16", "contiguous", "eager", "fail", "limits", impl="wrong"),
    ok("zoo_limits", "fp32", "contiguous", "eager", impl="refuses"),
    # the forward writes into its input x (registered functional): named wherever the op runs
    Case("zoo_mutates_input", "bf16", "contiguous", "eager", "fail", "mutation"),
    Case("zoo_mutates_input", "fp32", "transposed", "compile", "fail", "mutation"),
    Case("zoo_mutates_input", "fp16", "strided", "export", "fail", "mutation"),
    ok("zoo_mutates_input", "fp32", "zero_size", "eager"),
    # the backward writes dx into grad_output: named where the backward runs; forward-only modes pass
    Case("zoo_mutates_grad", "fp32", "contiguous", "eager", "fail", "mutation"),
    Case("zoo_mutates_grad", "bf16", "transposed", "eager", "fail", "mutation"),
    ok("zoo_mutates_grad", "fp16", "contiguous", "compile"),
    ok("zoo_mutates_grad", "bf16", "offset", "export"),
    # correct kernel, reference written as model code (x.float() ... .to(x.dtype)): passes, gradcheck too
    ok("zoo_float_ref", "fp32", "contiguous", "eager"),
    ok("zoo_float_ref", "bf16", "transposed", "eager"),
    ok("zoo_float_ref", "fp16", "strided", "compile"),
    ok("zoo_float_ref", "bf16", "offset", "export"),
    # correct kernel that rounds twice (Liger, HF LlamaRMSNorm): passes in bf16 and fp16 on every seed
    ok("zoo_double_round", "bf16", "contiguous", "eager"),
    ok("zoo_double_round", "fp16", "transposed", "eager"),
    ok("zoo_double_round", "bf16", "strided", "compile"),
    ok("zoo_double_round", "fp16", "misaligned", "export"),
]

# Every mode checks kernel evidence: the planted faults above, caught in cudagraphs (GPU) and export cells
CASES += [
    Case("zoo_cia", "fp32", "contiguous", "export", "fallback", "export"),  # gone after run_decompositions
    Case("zoo_cia", "bf16", "transposed", "export", "fallback", "evidence"),
    Case("zoo_cia", "fp32", "contiguous", "cudagraphs", "fallback", "evidence"),
    Case("zoo_routes_fp16", "fp16", "contiguous", "export", "fallback", "evidence"),
    Case("zoo_routes_fp16", "fp16", "transposed", "cudagraphs", "fallback", "evidence"),
    ok("zoo_routes_fp16", "bf16", "transposed", "export"),
    ok("zoo_routes_fp16", "fp32", "contiguous", "cudagraphs"),
    Case("zoo_hidden_copy", "bf16", "transposed", "export", "fallback", "evidence"),
    Case("zoo_hidden_copy", "fp32", "strided", "cudagraphs", "fallback", "evidence"),
    ok("zoo_hidden_copy", "fp16", "contiguous", "export"),
    ok("zoo_hidden_copy", "bf16", "offset", "cudagraphs"),
    ok("zoo_good", "fp32", "contiguous", "cudagraphs"),
    ok("zoo_good", "bf16", "transposed", "cudagraphs"),
    ok("zoo_good", "fp16", "misaligned", "cudagraphs"),
    ok("zoo_good", "bf16", "zero_size", "cudagraphs"),
    ok("zoo_good", "fp16", "broadcast", "export"),
    ok("zoo_good", "bf16", "zero_size", "export"),
    # a zero-size batch waives `expect` only where nothing ran: the decomposed program still runs
    # aten ops on the empty CPU tensors, so the kernel's absence shows (a GPU launches nothing for them)
    Case("zoo_cia", "fp32", "zero_size", "export", "fallback", "evidence", only="cpu"),
    # the fake impl lies about the output dtype (bf16/fp16) or strides (transposed): every mode names it
    Case("zoo_fake_dtype", "bf16", "contiguous", "eager", "fail", "fake_meta"),
    Case("zoo_fake_dtype", "fp16", "transposed", "compile", "fail", "fake_meta"),
    Case("zoo_fake_dtype", "bf16", "strided", "export", "fail", "fake_meta"),
    Case("zoo_fake_dtype", "fp16", "contiguous", "cudagraphs", "fail", "fake_meta"),
    ok("zoo_fake_dtype", "fp32", "contiguous", "compile"),
    ok("zoo_fake_dtype", "fp32", "transposed", "export"),
    Case("zoo_fake_strides", "fp32", "transposed", "compile", "fail", "fake_meta"),
    Case("zoo_fake_strides", "bf16", "transposed", "export", "fail", "fake_meta"),
    Case("zoo_fake_strides", "fp16", "transposed", "eager", "fail", "fake_meta"),
    Case("zoo_fake_strides", "fp32", "transposed", "cudagraphs", "fail", "fake_meta"),
    ok("zoo_fake_strides", "fp32", "contiguous", "compile"),
    ok("zoo_fake_strides", "bf16", "strided", "export"),
    ok("zoo_fake_strides", "fp16", "broadcast", "compile"),
    # aten while a CUDA graph is captured: only the replayed graph's kernels show it
    Case("zoo_graph_vanish", "fp32", "contiguous", "cudagraphs", "fallback", "evidence"),
    Case("zoo_graph_vanish", "bf16", "transposed", "cudagraphs", "fallback", "evidence"),
    ok("zoo_graph_vanish", "fp32", "contiguous", "compile"),
    ok("zoo_graph_vanish", "fp16", "contiguous", "eager"),
    ok("zoo_graph_vanish", "bf16", "strided", "export"),
    # a custom op with an extra CompositeImplicitAutograd kernel: tracers take the composite
    ok("zoo_cia_extra", "fp32", "contiguous", "eager"),
    # opcheck's fake test compares the composite tracing uses with the kernel: strides differ
    Case("zoo_cia_extra", "bf16", "transposed", "eager", "fail", "opcheck:test_faketensor"),
    Case("zoo_cia_extra", "bf16", "transposed", "compile", "fallback", "evidence"),
    Case("zoo_cia_extra", "fp32", "contiguous", "export", "fallback", "export"),
    Case("zoo_cia_extra", "fp16", "strided", "export", "fallback", "evidence"),
    Case("zoo_cia_extra", "fp32", "contiguous", "cudagraphs", "fallback", "evidence"),
]
#: The cases this CPU test suite runs (GPU-only ones run through .ci/gpu step zoo: tests/zoo/gpu_cases.py).
CPU_CASES = [c for c in CASES if c.device != "gpu"]

#: Check modules whose outcome does not depend on the input values (OPGATE_SKIP_CHECKS names).
SEED_INDEPENDENT = ("opcheck", "fakemeta", "evidence", "sass", "perf")
#: Seed-sensitive cases (numbers drawn at random decide them) re-run with two more seeds.
STABILITY = [
    c
    for c in CASES
    if c.op
    in (
        "zoo_good",
        "zoo_bf16_accum",
        "zoo_tail_unwritten",
        "zoo_ignores_offset",
        "zoo_wrong_backward",
        "zoo_double_round",
        "zoo_float_ref",
    )
    and c.mode == "eager"
]


#: (verdict, outcome) of each cell this process ran, by cell id, seed and OPGATE_SKIP_CHECKS: a test
#: that asserts more about a verdict case's cell reads the run the case made instead of repeating it
#: (the same cell, seed and checks, in one process).
_RUNS: dict[tuple[str, int, str], tuple[Verdict, CellOutcome]] = {}


def outcome_of(cell: Cell, workdir: Path, seed: int = SEED) -> tuple[Verdict, CellOutcome]:
    """:func:`tests.zoo.harness.run`, once per cell, seed and skipped checks in a process."""
    key = (cell.id, seed, os.environ.get("OPGATE_SKIP_CHECKS", ""))
    if key not in _RUNS:
        _RUNS[key] = run(cell, workdir, seed)
    return _RUNS[key]


def check_of(outcome: CellOutcome, name: str) -> CheckResult:
    found = [c for c in outcome.checks if c.name == name]
    assert found, f"check {name!r} did not run: {[c.name for c in outcome.checks]}"
    return found[0]


def assert_case(case: Case, tmp_path: Path, seed: int = SEED) -> None:
    verdict, result = outcome_of(case.cell(), tmp_path, seed)
    summary = [(c.name, c.status.value, c.summary[:160]) for c in result.checks]
    assert verdict.value == case.verdict, (
        f"{case.cell_id}: {verdict.value} ({result.reason}); checks: {summary}"
    )
    if case.check is not None:
        check = check_of(result, case.check)
        assert check.status.value == case.verdict, f"{case.check}: {check.status.value} ({check.summary})"
    if case.verdict == "pass":
        ran = [c for c in result.checks if c.status.value != "skip"]
        assert ran, "a passing cell must have run checks"


def cpu_cases(*modes: str) -> list[Case]:
    """The CPU cases of ``modes``, in table order."""
    return [c for c in CPU_CASES if c.mode in modes]
