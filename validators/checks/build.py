"""Mode ``build``: prove from the binaries which GPU arches an op's kernels hold — no GPU needed.

* CUDA C++ implementations are built (cached) with the cell's nvcc for the
  implementation's ``arch_policy``; ``cuobjdump`` must list SASS for every
  claimed arch (and PTX when ``ptx: true``), and every arch's cubin must hold
  the kernels the spec's CUDA evidence expects.
* External implementations whose spec names ``binaries`` (a prebuilt wheel's
  ``.so`` files, or the Triton kernels the op launches) are audited the same
  way, one arch per cell: :mod:`validators.checks.external_build`.
* Triton implementations are cross-compiled for the cell's arch with
  ``triton.compile(ASTSource(...), target=GPUTarget("cuda", 80|90, 32))`` in a
  child interpreter (never under ``TRITON_INTERPRET``); each cubin must hold
  SASS for that arch.  Signatures come from :mod:`validators.checks.triton_build`.

Verdicts: ``pass``; ``fail`` with cuobjdump's listing when an arch is missing or
the build breaks; ``unsupported`` for a torch/CUDA major mismatch or an arch the
policy does not claim; ``skip`` when this machine has no such nvcc or a
CPU-only torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opgate.validators.checks import CellOutcome
from opgate.validators.result import CheckResult, Verdict

if TYPE_CHECKING:
    from opgate.matrix.cell import Cell
    from opgate.matrix.spec import ImplSpec, OpSpec

CHECK = "build"
REPO_ROOT = Path(__file__).resolve().parents[2]
TRITON_TIMEOUT_S = 900
TRITON_BUILD = "opgate.validators.checks.triton_build"


def _outcome(status: Verdict, summary: str, details: dict[str, Any], start: float) -> CellOutcome:
    check = CheckResult(CHECK, status, summary, details, time.monotonic() - start)
    reason = summary if status in (Verdict.SKIP, Verdict.UNSUPPORTED, Verdict.ERROR) else ""
    return CellOutcome([check], [], reason, status if status is Verdict.SKIP else None)


def run_cell(cell: Cell, spec: OpSpec, device: str, seed: int, workdir: Path) -> CellOutcome:
    """The ``validators.checks`` entry point (device and seed do not matter to a build)."""
    return run_build_cell(cell, spec, workdir)


def run_build_cell(cell: Cell, spec: OpSpec, workdir: Path) -> CellOutcome:  # noqa: PLR0911
    start = time.monotonic()
    impl = spec.implementations[cell.impl]
    if cell.arch == "cpu":
        return _outcome(Verdict.SKIP, "build cells target a GPU arch, not cpu", {}, start)
    sass = impl.sass or [cell.arch]
    if cell.arch not in sass:
        return _outcome(
            Verdict.UNSUPPORTED, f"arch_policy of {impl.name} claims {sass}, not {cell.arch}", {}, start
        )
    try:
        libraries = _libraries(impl)
        if impl.kind != "cuda":  # a CUDA C++ impl's GPU cells load its own build: said after it
            _built(cell)
        if impl.kind == "cuda":
            return _with_libraries(_cuda_cell(cell, spec, impl, sass, start), libraries)
        if impl.kind == "triton":
            return _with_libraries(_triton_cell(cell, impl, workdir, start), libraries)
        if impl.audits_binaries:
            from opgate.validators.checks.external_build import external_cell

            return external_cell(cell, spec, impl, workdir, start)
    except Exception as exc:  # noqa: BLE001 (a build check reports, never raises into the worker)
        return _outcome(Verdict.ERROR, f"build check crashed: {type(exc).__name__}: {exc}", {}, start)
    return _outcome(Verdict.UNSUPPORTED, f"kind {impl.kind} has no binaries to inspect", {}, start)


def _libraries(impl: ImplSpec) -> list[dict[str, Any]]:
    """Build the C++ libraries the implementation's module builds at import (spec ``libraries``).

    Here, on a build lane and before the GPU cells start (they wait for this
    cell), rather than in the first GPU cell of every worker at once.  Built
    with the runtime's own toolchain and the implementation's arch policy: the
    key its module asks the builder for, so the GPU workers find it built.
    A library another process is building now is left to it (no lane waits
    for a build it cannot speed up); a failed build fails the cell.  Only
    in a run with GPUs (``OPGATE_BUILD_LIBRARIES=1``, set by the runner): on a
    CPU machine no cell loads them.
    """
    if not impl.libraries:
        return []
    from opgate.validators import cuda_build as cb

    if os.environ.get(cb.LIBRARIES_VARIABLE) != "1":  # set by a run with GPUs (validators.runner)
        return [
            {"name": lib.name, "state": "not built: no GPU in this run loads it"} for lib in impl.libraries
        ]

    found: list[dict[str, Any]] = []
    for lib in impl.libraries:
        entry: dict[str, Any] = {"name": lib.name}
        try:
            toolchain = cb.default_toolchain(install=False)
            built = cb.build(lib.name, lib.sources, impl.sass, impl.ptx, toolchain, wait=False)
        except cb.BuildBusy:
            entry["state"] = "being built by another process"
        except cb.CudaBuildUnsupported as exc:
            entry["state"] = f"not built: {exc}"
        except cb.CudaBuildError as exc:
            entry.update(state="failed", log=str(exc))
        else:
            state = "cached" if built.cache_hit else f"built in {built.build_s:.1f} s"
            entry.update(state=state, library=str(built.library))
        found.append(entry)
    return found


def _built(cell: Cell) -> None:
    """What this cell builds for GPU cells is built (or left to another): the pool may start them."""
    from opgate.validators.worker import notify_built

    notify_built(cell.id)


def _with_libraries(outcome: CellOutcome, libraries: list[dict[str, Any]]) -> CellOutcome:
    """The build check's result with its libraries; a library that failed to build fails the cell."""
    if not libraries or not outcome.checks:
        return outcome
    check = outcome.checks[0]
    check.details["libraries"] = libraries
    failed = [lib["name"] for lib in libraries if lib.get("state") == "failed"]
    if failed and check.status is Verdict.PASS:
        check.status = Verdict.FAIL
        check.summary = f"library {', '.join(failed)} failed to build; {check.summary}".rstrip("; ")
        return CellOutcome([check], outcome.kernels, check.summary, None)
    return outcome


def _expected_kernels(impl: ImplSpec) -> tuple[str, ...]:
    return tuple(impl.evidence_for("cuda", "eager").expect)


def _cuda_cell(cell: Cell, spec: OpSpec, impl: ImplSpec, sass: list[str], start: float) -> CellOutcome:
    import torch

    from opgate.validators import cuda_build as cb
    from opgate.validators.binaries import kernels_by_arch, list_arches
    from opgate.validators.toolchain import ToolchainUnavailable, ensure_nvcc

    ptx = impl.ptx
    details: dict[str, Any] = {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda": cell.cuda,
    }
    if torch.version.cuda is None:
        return _outcome(
            Verdict.SKIP,
            f"torch {torch.__version__} is CPU-only: no CUDA extension can be built for it",
            details,
            start,
        )
    if torch.version.cuda.split(".")[0] != cell.cuda.split(".")[0]:
        msg = (
            f"torch {torch.__version__} is built for CUDA {torch.version.cuda}; "
            f"CUDA {cell.cuda} is another major version"
        )
        return _outcome(Verdict.UNSUPPORTED, msg, details, start)
    try:
        toolchain = ensure_nvcc(cell.cuda)
    except ToolchainUnavailable as exc:
        return _outcome(Verdict.SKIP, str(exc), details, start)
    details["nvcc"] = toolchain.to_json()
    details["arch_list"] = cb.arch_list(sass, ptx)
    name = cb.library_name(spec.op, impl.name)
    try:
        built = cb.build(name, impl.sources, sass, ptx, toolchain)
        _built(cell)
    except cb.CudaBuildUnsupported as exc:
        return _outcome(Verdict.UNSUPPORTED, str(exc), details, start)
    except cb.CudaBuildError as exc:
        details["log"] = str(exc)
        return _outcome(Verdict.FAIL, f"build with nvcc {toolchain.release} failed", details, start)
    details.update(library=str(built.library), build_s=round(built.build_s, 2), cache_hit=built.cache_hit)
    found = list_arches(built.library)
    by_arch = kernels_by_arch(built.library) if found.has_device_code else {}
    return _judge_cuda(found, by_arch, sass, ptx, _expected_kernels(impl), details, toolchain.release, start)


def judge_binary(
    found: Any, by_arch: dict[str, list[str]], sass: list[str], ptx: bool, expect: tuple[str, ...]
) -> tuple[Verdict, str, dict[str, Any]]:
    """pass only if every claimed arch has SASS (PTX when asked) holding the expected kernels.

    ``by_arch`` lists kernels (entry functions, see :mod:`validators.binaries`);
    an expected pattern matches a kernel's mangled or demangled name.
    """
    from opgate.validators.binaries import demangle, matching, missing_arches, sass_satisfies

    wanted_ptx = [a.replace("sm_", "compute_") for a in sass] if ptx else []
    missing = missing_arches(found, sass, wanted_ptx)
    readable = demangle(sorted({k for ks in by_arch.values() for k in ks})) if expect else {}
    lacking: dict[str, list[str]] = {}
    for arch in sass:
        names = [k for a, ks in by_arch.items() if sass_satisfies(a, arch) for k in ks]
        gone = [p for p in expect if not matching(names, [p], readable)]
        if gone and arch not in missing:
            lacking[arch] = gone
    details: dict[str, Any] = {"binary": found.to_json(), "listing": found.listing}
    details.update(missing=missing, kernels_missing_by_arch=lacking)
    details["kernels_by_arch"] = {a: len(ks) for a, ks in by_arch.items()}
    have = f"SASS {', '.join(found.sass) or 'none'}; PTX {', '.join(found.ptx) or 'none'}"
    if missing:
        return Verdict.FAIL, f"binary lacks {', '.join(missing)} ({have})", details
    if lacking:
        text = "; ".join(f"{a}: {', '.join(g)}" for a, g in lacking.items())
        return Verdict.FAIL, f"expected kernels absent from cubins: {text}", details
    return Verdict.PASS, have, details


def _judge_cuda(  # noqa: PLR0917 (evidence gathered by the caller, judged here)
    found: Any,
    by_arch: dict[str, list[str]],
    sass: list[str],
    ptx: bool,
    expect: tuple[str, ...],
    details: dict[str, Any],
    release: str,
    start: float,
) -> CellOutcome:
    """A first-party CUDA C++ build judged by :func:`judge_binary`."""
    status, summary, found_details = judge_binary(found, by_arch, sass, ptx, expect)
    details.update(found_details)
    if status is Verdict.PASS:
        cached = " (cached)" if details.get("cache_hit") else ""
        summary = f"nvcc {release}{cached}: {summary}"
    return _outcome(status, summary, details, start)


def _cell_ptxas(cell: Cell) -> Path | CellOutcome:
    """The ptxas of the cell's CUDA version: Triton then assembles SASS with *that* toolkit.

    Without this, every Triton build cell would use the ptxas bundled in Triton's
    wheel and the CUDA axis would say nothing.  A missing toolkit is a ``skip``.
    """
    from opgate.validators.toolchain import ToolchainUnavailable, ensure_nvcc

    start = time.monotonic()
    try:
        toolchain = ensure_nvcc(cell.cuda)
    except ToolchainUnavailable as exc:
        return _outcome(Verdict.SKIP, str(exc), {}, start)
    ptxas = toolchain.nvcc.parent / "ptxas"
    if not ptxas.exists():
        return _outcome(Verdict.SKIP, f"no ptxas beside {toolchain.nvcc}", {}, start)
    return ptxas


def _cross_compile(request: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """``triton_build.main`` in a child: forked from this worker when it can be, else a fresh interpreter.

    The report, or ``{"stderr": tail}`` when the child produced none.
    """
    from opgate.validators import forkchild

    arg = json.dumps(request)
    if forkchild.can_fork(("torch", "triton"), env):
        forked, tail = forkchild.call_forked(f"{TRITON_BUILD}:main", arg, env, TRITON_TIMEOUT_S)
        return forked if forked is not None else {"stderr": tail}
    cmd = [sys.executable, "-m", TRITON_BUILD, arg]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TRITON_TIMEOUT_S, check=False)
    try:
        report: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"stderr": "\n".join(proc.stderr.strip().splitlines()[-15:])}
    return report


def _triton_cell(
    cell: Cell, impl: ImplSpec, workdir: Path, start: float, launches: list[dict[str, Any]] | None = None
) -> CellOutcome:
    """Cross-compile in a child interpreter and judge each cubin's SASS.

    ``launches`` (recorded kernel launches of an external implementation, see
    :mod:`validators.checks.triton_launches`) replaces the module's own kernels.
    """
    from opgate.validators.binaries import list_arches, sass_satisfies

    outdir = workdir / "build" / cell.arch
    outdir.mkdir(parents=True, exist_ok=True)
    request = {
        "module": impl.module,
        "arch": cell.arch,
        "dtypes": list(impl.dtypes),
        "signatures": getattr(impl, "build_signatures", None),
        "outdir": str(outdir),
        "launches": launches,
    }
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    ptxas = _cell_ptxas(cell)
    if isinstance(ptxas, CellOutcome):
        return ptxas
    env["TRITON_PTXAS_PATH"] = str(ptxas)
    report = _cross_compile(request, env)
    if "stderr" in report:
        return _outcome(Verdict.ERROR, "triton cross-compile child produced no report", report, start)
    details: dict[str, Any] = {"triton": report.get("triton"), "kernels": report.get("kernels", [])}
    details["ptxas"] = str(ptxas)
    if report.get("error"):
        return _outcome(Verdict.ERROR, report["error"], details, start)
    failed = [k for k in details["kernels"] if k.get("error")]
    for k in details["kernels"]:
        if k.get("cubin"):
            found = list_arches(Path(k["cubin"]))
            k["sass"] = list(found.sass)
            k["listing"] = found.listing
            if not any(sass_satisfies(a, cell.arch) for a in found.sass):
                failed.append(k)
    if not details["kernels"]:
        return _outcome(Verdict.ERROR, f"no Triton kernel found in {impl.module}", details, start)
    if failed:
        names = sorted({f"{k['kernel']}[{k['dtype']}]" for k in failed})
        return _outcome(Verdict.FAIL, f"no {cell.arch} SASS for {', '.join(names)}", details, start)
    slowest = max(k["compile_s"] for k in details["kernels"])
    summary = f"{len(details['kernels'])} kernel builds hold {cell.arch} SASS (slowest {slowest:.2f} s)"
    return _outcome(Verdict.PASS, summary, details, start)
