"""Environment controls: tell "this mode is broken here" from "this op is broken".

On the H200 image (torch 2.11) ``aoti_load_package`` segfaults for a package of
a plain module with no custom op at all; every op's ``aoti`` cell then dies
with SIGSEGV, and without a control each of them reads as the op's failure.
A *control* runs the op's own reference (plain PyTorch, the same signature and
inputs) through the same mode by the same machinery (the mode's artifact and
check, in a worker like any cell, so a segfault is contained the same way).

* One control per (op, torch, CUDA, arch, mode, dtype, shape set), in the
  contiguous layout: its id is the cell's with implementation ``control``
  (``rms_norm.control-pt2.11-cu13.0-sm_90-bf16-contiguous-aoti``), so one
  control answers for every implementation and layout of that op there.
* Controls run on demand: the first op cell of a group that fails or errors
  in a controlled mode schedules its group's control (served from the verdict
  cache like any cell when nothing changed).  A healthy environment pays
  nothing.
* A failed cell whose control failed *the same way* (:func:`failure_kind`:
  the same signal, a timeout, or the same mode check failing) becomes
  ``environment``, with the control's reason and the op's own verdict kept.
  Correctness failures are never excused: a compiled reference a few ulp off
  must not hide an op's wrong numbers.
* Every op cell of a group whose control ran gets a ``control`` check naming
  it (PASS: the mode works here, so a failure is the op's; ENVIRONMENT: the
  mode is broken here): the control's outcome beside the cell.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from opgate.matrix.cell import Cell
from opgate.matrix.modes import MODES
from opgate.matrix.spec_schema import CONTROL_IMPL
from opgate.validators.result import CellResult, CheckResult, Verdict

if TYPE_CHECKING:
    from opgate.matrix.spec import ImplSpec, OpSpec

__all__ = [
    "CONTROL_IMPL",
    "control_impl",
    "control_of",
    "fails_alike",
    "failure_kind",
    "is_control",
    "is_linked",
    "link",
    "linked",
]

#: Modes whose machinery (Dynamo/Inductor, CUDA graphs, torch.export, AOTInductor) can be broken
#: by the environment independently of any op.  Eager has nothing between the op and torch.
#: (:attr:`opgate.matrix.modes.Mode.controlled`)
CONTROLLED_MODES = frozenset(name for name, m in MODES.items() if m.controlled)
#: Op cell verdicts a control can explain; a fallback is evidence about the op, flaky its nondeterminism.
EXCUSABLE = frozenset({Verdict.FAIL, Verdict.ERROR})
CONTROL_LAYOUT = "contiguous"
CONTROL_CHECK = "control"
_SIGNAL = re.compile(r"worker killed by (\S+)")


def is_control(cell: Cell) -> bool:
    return cell.impl == CONTROL_IMPL


def control_of(cell: Cell) -> Cell | None:
    """The control cell answering for ``cell``, or None (eager and build cells, controls themselves)."""
    if cell.mode not in CONTROLLED_MODES or is_control(cell):
        return None
    return dataclasses.replace(cell, impl=CONTROL_IMPL, layout=CONTROL_LAYOUT, overrides=())


def control_impl(spec: OpSpec) -> ImplSpec:
    """The implementation a control runs: the op's reference, with no kernel evidence to look for."""
    from opgate.matrix.spec import ImplSpec

    return ImplSpec(
        name=CONTROL_IMPL,
        kind="external",
        module="",
        entry=spec.reference,
        qualname=None,
        evidence={},
        sources=[],
        arch_policy={},
        requires=[],
        dtypes=list(spec.dtypes),
        layouts=[CONTROL_LAYOUT],
        modes=sorted(CONTROLLED_MODES),
        unsupported=[],
        tolerance=spec.tolerance,
        copies_allowed=spec.copies_allowed,
        mode_evidence={},
    )


def control_checks(mode: str) -> tuple[str, ...]:
    """What a control runs: the mode's own check (build, load, replay) and the artifact's numbers."""
    return (mode, "correctness")


def failure_kind(result: CellResult) -> str | None:
    """How a bad cell failed, comparable across op and control; None when it did not fail or error.

    ``signal SIGSEGV`` (the worker died), ``timeout``, or ``check aoti fail``
    (the mode's own check: the artifact could not be built, loaded or run).
    Other checks (correctness, evidence, opcheck) say something about the op
    itself and give no kind: such a failure is never the environment's.
    """
    if result.verdict not in EXCUSABLE:
        return None
    reason = result.reason
    if not result.checks or reason.startswith(("worker ", "timeout")):
        found = _SIGNAL.search(reason)
        if found:
            return f"signal {found.group(1)}"
        if reason.startswith("timeout"):
            return "timeout"
        if reason.startswith("worker "):
            return "worker died"
    own = next((c for c in result.checks if c.name == result.cell.mode), None)
    if own is not None and own.status in EXCUSABLE:
        return f"check {own.name} {own.status.value}"
    return None


def is_linked(result: CellResult) -> bool:
    """Whether ``result`` already carries its control's outcome (:func:`link` ran on it)."""
    return any(c.name == CONTROL_CHECK for c in result.checks)


def _is_bad(control: CellResult) -> bool:
    return control.verdict.is_bad or control.verdict is Verdict.ERROR


def fails_alike(result: CellResult, control: CellResult) -> bool:
    """The control failed too, and the same way: ``result``'s failure is the environment's."""
    mine = failure_kind(result)
    return _is_bad(control) and mine is not None and mine == failure_kind(control)


def linked(result: CellResult, finished: Mapping[str, CellResult]) -> CellResult:
    """``result`` beside its control when that is among ``finished`` (by id) and not there yet."""
    control = control_of(result.cell)
    if control is None or control.id not in finished or is_linked(result):
        return result
    return link(result, finished[control.id])


def link(result: CellResult, control: CellResult) -> CellResult:
    """``result`` with its control's outcome beside it, and ``environment`` when both failed alike."""
    checks = [c for c in result.checks if c.name != CONTROL_CHECK]
    mode = result.cell.mode
    control_why = control.reason or control.verdict.value
    details: dict[str, Any] = {
        "control": control.id,
        "verdict": control.verdict.value,
        "reason": control.reason,
    }
    if not _is_bad(control):
        check = CheckResult(
            CONTROL_CHECK,
            Verdict.PASS,
            f"the op's reference passes {mode} here ({control.id}): the mode works in this environment",
            details,
        )
        return dataclasses.replace(result, checks=[*checks, check])
    mine, theirs = failure_kind(result), failure_kind(control)
    same = fails_alike(result, control)
    details = {**details, "op_failure": mine, "control_failure": theirs, "same_failure": same}
    if not same:
        summary = f"{mode} is broken here for the op's reference too ({control.id}: {control_why})"
        if result.verdict in EXCUSABLE:
            summary += f", but the op failed differently ({mine or 'a check of its own'}): its verdict stands"
        check = CheckResult(CONTROL_CHECK, Verdict.ENVIRONMENT, summary, details)
        return dataclasses.replace(result, checks=[*checks, check])
    summary = f"{mode} fails the same way ({mine}) for the op's own reference ({control.id}: {control_why})"
    details["op_verdict"] = result.verdict.value
    check = CheckResult(CONTROL_CHECK, Verdict.ENVIRONMENT, summary, details)
    reason = (
        f"environment: {mode} is broken here, the op's own reference fails the same way "
        f"({control.id}: {control_why}); the op's own result: {result.verdict.value}: {result.reason}"
    )
    return dataclasses.replace(result, verdict=Verdict.ENVIRONMENT, checks=[*checks, check], reason=reason)
