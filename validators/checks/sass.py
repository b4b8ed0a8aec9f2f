"""sass: on a GPU, does the CUDA C++ op's binary hold machine code for *this* device?

A library built for sm_90 loaded on an sm_80 GPU still imports; its kernels
then either JIT from PTX (slow first call, no arch-specific code paths) or do
not run at all.  The build cells prove what the binary holds; this check
records the device's compute capability next to the binary actually loaded
in the cell and lists every kernel without SASS for it.

* ``pass``: every kernel has SASS that runs on this device;
* ``fallback``: some kernel would JIT from PTX (it runs, but not as built);
* ``fail``: some kernel has neither SASS nor usable PTX for this device.

Applies to GPU cells of ``kind: cuda`` implementations whose module exposes the
loaded build as ``BUILT`` (see :func:`opgate.validators.cuda_build.load_library`), and of
external implementations whose spec names ``binaries.files`` / ``loaded``:
there the binaries are the declared files this process has *mapped*
(``/proc/self/maps``, :func:`validators.binsource.loaded_binaries`), recorded
in the result, and the op's own kernels (its CUDA evidence patterns) are
judged.  None of them mapped after the op ran is a ``fallback``: the op's
numbers came from some other code path than the library's CUDA binary.
Triton kernels are compiled for the running device on first call, so they
always run native code and are not checked here.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from opgate.validators.checks.base import Check
from opgate.validators.checks.context import CellContext
from opgate.validators.result import CheckResult, Verdict

NAME = "sass"


def applies(ctx: CellContext) -> str | None:
    if ctx.device_kind != "cuda":
        return "machine code for a device is checked on GPUs only"
    binaries = ctx.impl.binaries
    if ctx.impl.kind == "external" and (binaries.get("files") or binaries.get("loaded")):
        return None
    if ctx.impl.kind == "triton":
        return "Triton kernels are compiled for the running device"
    if ctx.impl.kind != "cuda":
        return (
            f"kind {ctx.impl.kind}: the spec names no binaries (binaries.files / loaded) whose machine code "
            "could be inspected"
        )
    return None


def judge(report: dict[str, Any]) -> CheckResult:
    """Verdict from :func:`validators.binaries.gpu_sass_report`'s dict (pure, unit-tested)."""
    missing = list(report.get("kernels_without_sass") or [])
    arch = report.get("device_arch", "?")
    if not missing:
        return CheckResult(NAME, Verdict.PASS, f"every kernel has SASS for {arch}", report)
    names = ", ".join(missing[:6]) + (" ..." if len(missing) > 6 else "")
    if report.get("jit_from_ptx"):
        return CheckResult(NAME, Verdict.FALLBACK, f"no {arch} SASS, JIT from PTX: {names}", report)
    return CheckResult(NAME, Verdict.FAIL, f"no {arch} SASS and no usable PTX: {names}", report)


def judge_loaded(reports: list[dict[str, Any]], declared: str) -> CheckResult:
    """Verdict over every declared binary that is mapped (pure, unit-tested)."""
    if not reports:
        return CheckResult(
            NAME, Verdict.FALLBACK, f"none of the declared binaries ({declared}) is loaded in this process"
        )
    results = [judge(r) for r in reports]
    worst = max(results, key=lambda r: (r.status is Verdict.FAIL, r.status is Verdict.FALLBACK))
    names = ", ".join(Path(str(r["binary"])).name for r in reports)
    details = {"loaded": [r["binary"] for r in reports], "reports": reports}
    return CheckResult(NAME, worst.status, f"loaded {names}: {worst.summary}", details)


def run(ctx: CellContext) -> CheckResult:
    from opgate.validators.binaries import gpu_sass_report

    if ctx.impl.kind == "external":
        from opgate.validators.binsource import declared_globs, loaded_binaries

        expect = ctx.impl.evidence_for("cuda", ctx.mode).expect
        loaded = loaded_binaries(ctx.impl.binaries, ctx.impl.module)
        declared = ", ".join(declared_globs(ctx.impl.binaries, None)) or f"libraries of {ctx.impl.module}"
        return judge_loaded([gpu_sass_report(p, kernels=expect) for p in loaded], declared)
    module = importlib.import_module(ctx.impl.module or ctx.impl.entry.split(":")[0])
    built = getattr(module, "BUILT", None)
    library = getattr(built, "library", None)
    if library is None:
        return CheckResult(NAME, Verdict.SKIP, f"{module.__name__} exposes no BUILT library to inspect")
    return judge(gpu_sass_report(Path(library)))


CHECKS = [Check(NAME, applies, run)]
