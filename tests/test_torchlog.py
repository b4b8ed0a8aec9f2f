"""What torch warns while a cell runs reaches the check that fails or crashes (validators.checks.torchlog).

The case behind it (``results/runs/h200-triton-op-repro``): on torch 2.11 a
``wrap_triton`` kernel whose defaulted constexpr the call leaves out crashes in
Inductor's launcher (``missing 1 required positional argument: '_grid_2'``);
the cause is only in a warning torch logged while compiling, earlier.
"""

from __future__ import annotations

import logging

import pytest
import torch

import tests.zoo.harness  # noqa: F401 - TRITON_INTERPRET before triton is imported, as in a CPU worker

import triton  # isort: skip - after the harness
import triton.language as tl  # isort: skip

from opgate.validators.checks import torchlog
from opgate.validators.checks.base import Check, always, run_check
from opgate.validators.checks.context import CellContext
from opgate.validators.result import CheckResult, Verdict

#: The logger and the words torch uses (torch/_higher_order_ops/triton_kernel_wrap.py).
TKW_LOGGER = "torch._higher_order_ops.triton_kernel_wrap"
MUTATED = "Encountered an exception in identify_accessed_tensors, assuming every input is mutated"
MISMATCH = (
    "Incorrect number of arguments passed to kernel: passed ['x_ptr', 'n', 'BLOCK'], "
    "expected ['x_ptr', 'n', 'BLOCK', 'TWICE']."
)
LAUNCHER = "launcher() missing 1 required positional argument: '_grid_2'"


@triton.jit  # type: ignore[untyped-decorator]
def _scale_kernel(x_ptr, n, BLOCK: tl.constexpr, TWICE: tl.constexpr = False):  # type: ignore[no-untyped-def]
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(x_ptr + offs, x * (4 if TWICE else 2), mask=offs < n)


def _warn_mismatch() -> None:
    """What torch logs when its analysis of a wrap_triton call raises (the exception attached)."""
    try:
        raise ValueError(MISMATCH)
    except ValueError:
        logging.getLogger(TKW_LOGGER).warning(MUTATED, exc_info=True)


def _check(name: str, run: object) -> Check:
    return Check(name, always, run)  # type: ignore[arg-type]


def _crash(ctx: CellContext) -> CheckResult:
    raise TypeError(LAUNCHER)


def _compile_and_crash(ctx: CellContext) -> CheckResult:
    _warn_mismatch()
    raise TypeError(LAUNCHER)


def _compile_ok(ctx: CellContext) -> CheckResult:
    _warn_mismatch()
    return CheckResult("compile", Verdict.PASS, "compiled")


CTX = CellContext.__new__(CellContext)  # the checks above never read it


def test_a_crash_after_torch_warned_names_the_cause_and_the_fix() -> None:
    with torchlog.collecting():
        result = run_check(_check("correctness", _compile_and_crash), CTX)
    assert result.status is Verdict.ERROR
    assert LAUNCHER in result.summary
    assert "ValueError: Incorrect number of arguments passed to kernel" in result.summary
    assert "defaulted tl.constexpr ones included" in result.summary
    assert result.details["torch_logged"] == [f"{MUTATED} (ValueError: {MISMATCH})"]


def test_the_warning_of_an_earlier_passing_check_reaches_the_crashing_one() -> None:
    with torchlog.collecting():
        compiled = run_check(_check("compile", _compile_ok), CTX)
        crashed = run_check(_check("correctness", _crash), CTX)
    assert compiled.status is Verdict.PASS
    assert "torch_logged" not in compiled.details  # a passing check is left as it is
    assert compiled.summary == "compiled"
    assert crashed.status is Verdict.ERROR
    assert "pass every kernel parameter at the call" in crashed.summary
    assert crashed.details["torch_logged"][0].startswith(MUTATED)


def test_cells_do_not_share_what_torch_warned() -> None:
    with torchlog.collecting():
        _warn_mismatch()
    with torchlog.collecting():
        result = run_check(_check("correctness", _crash), CTX)
    assert "torch_logged" not in result.details
    assert result.summary == f"TypeError: {LAUNCHER}"
    assert torchlog.logged() == []  # and nothing is collected outside a cell


def test_torchs_real_analysis_warning_is_collected_without_a_hint_for_another_cause() -> None:
    """torch's own analysis of a kernel call, missing its defaulted constexpr, on this GPU-less machine.

    Here it fails before it counts the arguments (no GPU target, or an interpreted kernel), so
    torch logs the same warning with another cause: kept for the report, no hint claimed.
    """
    from torch._higher_order_ops.triton_kernel_wrap import identify_accessed_tensors

    x = torch.zeros(8)
    with torchlog.collecting() as lines:
        accesses = identify_accessed_tensors(_scale_kernel, {"x_ptr": x, "n": 8, "BLOCK": 8}, {})
    assert accesses is not None  # torch went on, every input taken as mutated
    assert any(line.startswith(MUTATED) for line in lines), lines
    assert torchlog.hint(lines) is None


@pytest.mark.parametrize("level", [logging.INFO, logging.DEBUG])
def test_below_warning_is_not_kept(level: int) -> None:
    with torchlog.collecting() as lines:
        logging.getLogger(TKW_LOGGER).log(level, "TTIR: ...")
    assert lines == []


def test_repeated_warnings_are_kept_once_and_bounded() -> None:
    with torchlog.collecting() as lines:
        for i in range(3 * torchlog.MAX_KEPT):
            logging.getLogger("torch._dynamo").warning("recompiled %d", i % (2 * torchlog.MAX_KEPT))
            logging.getLogger("torch._dynamo").warning("recompiled %d", 0)
    assert len(lines) == torchlog.MAX_KEPT
    assert len(set(lines)) == len(lines)


def test_inductors_cudagraph_skip_reaches_the_collection_not_a_handler_on_torch_alone() -> None:
    """The cudagraphs check lists why Inductor skipped graphs: its logger stops short of ``torch``."""
    from torch._inductor.cudagraph_utils import cudagraphs_log

    message = "skipping cudagraphs due to mutated inputs (1 instances)"
    on_torch = _Lines()
    logging.getLogger("torch").addHandler(on_torch)
    try:
        with torchlog.collecting() as collected:
            cudagraphs_log.warning(message)
    finally:
        logging.getLogger("torch").removeHandler(on_torch)
    assert on_torch.messages == []  # what the check saw before: nothing
    assert collected == [message]
    cudagraphs_log.warning("after the block")
    assert collected == [message]  # detached when the block ends


class _Lines(logging.Handler):
    """Every message a handler on one logger gets."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
