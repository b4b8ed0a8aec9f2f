"""Run every check that applies to one cell, inside the worker process.

Which checks run is decided by the cell's mode (:data:`MODE_CHECKS`), in
order: the fake-vs-real metadata check first (a lying fake impl must be caught
before a compiled consumer reads the output wrongly), then the mode's own check
(it builds the compiled/exported artifact and reports a build failure), then
the correctness of that artifact, then the kernel evidence, in every mode.  A
cell the spec declares unsupported runs the limits check alone.  A GPU cell
whose kernel evidence was not checked is never ``pass`` (:func:`unchecked_evidence`).

Process-wide state a cell changes is restored afterwards (the worker reuses
its process for the next cell): deterministic-algorithms mode, Dynamo's
caches and counters, Inductor's kernel-profiling flag.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from opgate.matrix.modes import MODES
from opgate.matrix.modes import mode as mode_of
from opgate.validators.checks import torchlog
from opgate.validators.checks.base import charge_waits, waited_s
from opgate.validators.interpreted_triton_op import support_triton_ops
from opgate.validators.interpreter import round_bf16_to_nearest
from opgate.validators.result import CheckResult, Verdict

if TYPE_CHECKING:
    from opgate.matrix.cell import Cell
    from opgate.matrix.spec import ImplSpec, OpSpec
    from opgate.validators.checks import CellOutcome
    from opgate.validators.checks.base import Check
    from opgate.validators.checks.context import CellContext

#: Check modules per mode, in run order (:attr:`opgate.matrix.modes.Mode.checks`); ``build``
#: is not among them: its cells are delegated whole to ``validators.checks.build``.
MODE_CHECKS: Mapping[str, tuple[str, ...]] = {name: m.checks for name, m in MODES.items() if m.checks}

#: Checks owned elsewhere that a checkout may not have yet (absent -> not run).
OPTIONAL_CHECKS = frozenset({"perf"})


def skipped_checks() -> frozenset[str]:
    """Checks switched off for this run with ``OPGATE_SKIP_CHECKS=perf,...``.

    Used for throughput runs that share a GPU between several workers, where
    timings would be noise: such a run records no perf rather than bad perf.
    """
    raw = os.environ.get("OPGATE_SKIP_CHECKS", "")
    return frozenset(name.strip() for name in raw.split(",") if name.strip())


def checks_for(mode: str) -> list[Check]:
    """The Check objects of a mode, imported lazily (each module exposes ``CHECKS``)."""
    if mode not in MODE_CHECKS:
        raise KeyError(f"no checks for mode {mode!r}; known: {', '.join(MODE_CHECKS)}")
    found: list[Check] = []
    for name in MODE_CHECKS[mode]:
        if name in skipped_checks():
            continue
        try:
            module = importlib.import_module(f"opgate.validators.checks.{name}")
        except ModuleNotFoundError as exc:
            if name in OPTIONAL_CHECKS and exc.name == f"opgate.validators.checks.{name}":
                continue
            raise
        found.extend(module.CHECKS)
    return found


@contextlib.contextmanager
def poisoned_allocations() -> Iterator[None]:
    """Make ``torch.empty*`` return NaN-filled memory (CPU and CUDA) for the duration.

    PyTorch fills uninitialised memory when deterministic algorithms are on and
    ``torch.utils.deterministic.fill_uninitialized_memory`` is set; ``warn_only``
    keeps ops without a deterministic variant running.  Every allocation an op
    makes for its outputs is then NaN until written, so an unwritten element
    shows up as NaN against a finite oracle.  The mode stays on for the whole
    cell, because Dynamo guards on it: toggling it between calls would recompile.
    """
    import torch

    was_on = torch.are_deterministic_algorithms_enabled()
    was_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    was_fill = torch._C._get_deterministic_fill_uninitialized_memory()
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch._C._set_deterministic_fill_uninitialized_memory(True)
    try:
        yield
    finally:
        torch._C._set_deterministic_fill_uninitialized_memory(was_fill)
        torch.use_deterministic_algorithms(was_on, warn_only=was_warn)


@contextlib.contextmanager
def fresh_compiler_state(cpu: bool) -> Iterator[None]:
    """Dynamo reset and counters cleared; on CPU, Inductor's C++ kernels named in the profiler."""
    import torch
    import torch._dynamo
    import torch._inductor.config as inductor_config
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    patch = inductor_config.patch({"cpp.enable_kernel_profile": True}) if cpu else contextlib.nullcontext()
    try:
        with patch:
            yield
    finally:
        torch._dynamo.reset()


def _installed(dist: str) -> bool:
    try:
        importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def missing_requirement(requires: list[str]) -> str | None:
    """Why the cell cannot run here (a required distribution is missing), or None."""
    missing = [d for d in requires if not _installed(d)]
    return f"needs {', '.join(missing)}, not installed here" if missing else None


def _build_outcome(cell: Cell, spec: OpSpec, device: str, seed: int, workdir: Path) -> CellOutcome:
    """Mode ``build``: delegated to ``validators.checks.build`` (binary evidence, no device)."""
    from opgate.validators.checks import CellOutcome

    try:
        build = importlib.import_module("opgate.validators.checks.build")
    except ModuleNotFoundError as exc:
        if exc.name != "opgate.validators.checks.build":
            raise
        return CellOutcome([], [], "no build check is installed in this opgate", Verdict.SKIP)
    waited_before = waited_s()
    outcome: CellOutcome = build.run_cell(cell, spec, device, seed, workdir)
    if outcome.checks:  # a build cell's one check: its lock waits are waits
        charge_waits(outcome.checks[0], waited_before)
    return outcome


def unchecked_evidence(results: list[CheckResult], device: str, mode: str) -> CheckResult | None:
    """An ``error`` for a GPU cell that would pass although its kernel evidence was not checked.

    Specs are refused when a GPU cell could run without a cuda ``expect`` rule
    (``matrix/spec.py``), so this fires only where evidence was switched off or
    skipped for another reason: the kernel names are the point of a GPU cell.
    """
    from opgate.validators.result import combine

    if not device.startswith("cuda") or mode not in MODE_CHECKS or combine(results) is not Verdict.PASS:
        return None
    evidence = next((r for r in results if r.name == "evidence"), None)
    if evidence is not None and evidence.status is not Verdict.SKIP:
        return None
    why = evidence.summary if evidence is not None else "the evidence check did not run (OPGATE_SKIP_CHECKS?)"
    return CheckResult(
        "evidence",
        Verdict.ERROR,
        f"kernel evidence not checked ({why}): a GPU cell is never pass without it",
        {"unchecked": True},
    )


def _reason(checks: list[CheckResult], verdict: Verdict) -> str:
    if verdict is Verdict.PASS:
        return ""
    first = next((c for c in checks if c.status is verdict), None)
    return f"{first.name}: {first.summary}" if first is not None else ""


def _setup_failed(cell: Cell, impl: ImplSpec | None, exc: Exception) -> CellOutcome:
    """A cell whose op could not even be set up: ``error``, unless the spec declared it unsupported.

    A declared-unsupported cell whose op refuses before running (a CUDA C++ op on a
    CPU-only torch cannot load its library) gave the clear refusal the limits check
    asks for: ``unsupported``, with the message.
    """
    from opgate.validators.checks import CellOutcome
    from opgate.validators.checks.base import error_result

    declared = impl.unsupported_reason(cell.id) if impl is not None else None
    if declared is None:
        check = error_result("setup", exc)
        return CellOutcome([check], [], f"setup: {check.summary}", Verdict.ERROR)
    raised = f"{type(exc).__name__}: {exc}"
    refused = CheckResult(
        "limits",
        Verdict.UNSUPPORTED,
        f"declared unsupported ({declared}); refused at load: {raised}",
        {"declared": declared, "raised": raised, "stage": "setup"},
    )
    return CellOutcome([refused], [], refused.summary, None)


def _oracle_refused(ctx: CellContext) -> CheckResult | None:
    """``error`` before any check when the reference's float64 oracle is not float64 (it names the line)."""
    from opgate.validators.checks.oracle import audit

    problem = audit(ctx.reference, ctx.inputs(shapes=ctx.shapes[:1])[0])
    return None if problem is None else CheckResult("oracle", Verdict.ERROR, problem, {"problem": problem})


def _built_s() -> float:
    """Seconds this worker has spent building CUDA extensions so far (validators.cuda_build)."""
    from opgate.validators.cuda_build import BUILD_SECONDS

    return BUILD_SECONDS[0]


def _checked(cell: Cell, ctx: CellContext, device: str) -> list[CheckResult]:
    """The cell's checks, run: the mode's (a control's subset), or the limits of an unsupported cell."""
    from opgate.validators.checks.base import run_check
    from opgate.validators.controls import control_checks, is_control

    if ctx.impl.unsupported_reason(cell.id) is not None:
        from opgate.validators.checks import limits

        return [run_check(c, ctx) for c in limits.CHECKS]
    checks = checks_for(cell.mode)
    if is_control(cell):
        checks = [c for c in checks if c.name in control_checks(cell.mode)]
    results = [run_check(c, ctx) for c in checks]
    unchecked = None if is_control(cell) else unchecked_evidence(results, device, cell.mode)
    if unchecked is not None:
        results = [r for r in results if r.name != "evidence"] + [unchecked]
    return results


def run_cell(cell: Cell, spec: OpSpec, device: str, seed: int, workdir: Path) -> CellOutcome:
    """The agreed entry point (see :func:`validators.checks.run_cell`)."""
    from opgate.validators.checks import CellOutcome
    from opgate.validators.result import combine

    if mode_of(cell.mode).binaries:
        return _build_outcome(cell, spec, device, seed, workdir)
    if mode_of(cell.mode).gpu_only and not device.startswith("cuda"):
        return CellOutcome([], [], f"mode {cell.mode} needs a CUDA device", Verdict.SKIP)
    if device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the op module decorates its kernels
        round_bf16_to_nearest()  # the interpreter truncates to bf16; the GPU rounds
        support_triton_ops()  # torch.library.triton_op ops under the interpreter (see there)
    if spec.root is not None and str(spec.root) not in sys.path:
        sys.path.insert(0, str(spec.root))
    impl = spec.implementations.get(cell.impl)
    missing = missing_requirement(impl.requires) if impl is not None else None
    if missing:
        return CellOutcome([], [], missing, Verdict.SKIP)

    import torch

    from opgate.validators.checks.artifacts import make_artifact
    from opgate.validators.checks.context import build_context
    from opgate.validators.layouts import LayoutError

    workdir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    built_before, waited_before = _built_s(), waited_s()
    with fresh_compiler_state(device == "cpu"), poisoned_allocations(), torchlog.collecting():
        try:
            ctx = build_context(cell, spec, device, seed, workdir)
            ctx.inputs()  # layouts are generated (and verified) before any check runs
        except LayoutError as exc:
            return CellOutcome([], [], f"layout {cell.layout}: {exc}", Verdict.SKIP)
        except Exception as exc:  # noqa: BLE001 - an op that does not import is this cell's error
            return _setup_failed(cell, impl, exc)
        ctx.artifact = make_artifact(cell.mode, ctx.op, spec.dynamic_shapes, workdir)
        refused = _oracle_refused(ctx)
        t_setup, setup_build_s = time.perf_counter(), _built_s() - built_before
        setup_wait_s = waited_s() - waited_before
        results = [refused] if refused is not None else _checked(cell, ctx, device)
        t_checks = time.perf_counter()
    # where a slow cell's time went outside its checks (the checks time themselves), in its log
    print(
        f"=== set-up {t_setup - t0:.2f} s (op, inputs, oracle; {setup_build_s:.2f} s of it the op's "
        f"CUDA build, {setup_wait_s:.2f} s waiting on another process's), checks {t_checks - t_setup:.2f} s, "
        f"compiler reset {time.perf_counter() - t_checks:.2f} s",
        file=sys.stderr,
    )
    verdict = combine(results)
    return CellOutcome(
        results,
        list(ctx.kernels),
        _reason(results, verdict),
        None,
        round(setup_build_s, 3),
        round(setup_wait_s, 3),
    )
