"""Build cells of external implementations: the arch audit of the binaries a team installs.

A prebuilt wheel is audited as it is installed, without a GPU, one arch per
cell (the compat table's sm_80 / sm_90 columns say "binary only" where no
such GPU ran):

* ``binaries.files`` / ``binaries.loaded`` (:mod:`validators.binsource`):
  every declared library must hold SASS for the cell's arch (and PTX for it
  when ``arch_policy.ptx`` asks), and each kernel the spec's CUDA evidence
  expects must be in that arch's cubins — judged by the same
  :func:`validators.checks.build.judge_binary` as opgate's own CUDA builds;
* ``binaries.triton``: the library ships Triton source, so its binaries are
  the cubins Triton would cache on such a device.  The kernels the op really
  launches are recorded on the sample inputs
  (:mod:`validators.checks.triton_launches`) and cross-compiled for the
  cell's arch like opgate's own Triton kernels.

Verdicts: ``pass``; ``fail`` when an arch, a PTX the policy asks for, an
expected kernel, or every declared file is missing; ``skip`` when the
distribution is not installed or (``loaded``) the module mapped no library
with device code on this machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opgate.validators.checks import CellOutcome
from opgate.validators.checks.build import _outcome, _triton_cell, judge_binary
from opgate.validators.result import Verdict

if TYPE_CHECKING:
    from opgate.matrix.cell import Cell
    from opgate.matrix.spec import ImplSpec, OpSpec

CHILD_TIMEOUT_S = 600


def _child(module: str, request: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    cmd = [sys.executable, "-m", module, json.dumps(request)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, check=False)
    try:
        report: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        return {"error": f"{module} produced no report: {tail or f'exit {proc.returncode}'}"}
    return report


def external_cell(cell: Cell, spec: OpSpec, impl: ImplSpec, workdir: Path, start: float) -> CellOutcome:
    if impl.binaries.get("triton"):
        return _launched_triton_cell(cell, spec, impl, workdir, start)
    from opgate.validators.binsource import BinariesUnavailable, declared_files, declared_globs

    details: dict[str, Any] = {"binaries_spec": dict(impl.binaries)}
    files: list[Path] = []
    if impl.binaries.get("files"):
        try:
            files, version, root = declared_files(impl.binaries, cell.cuda)
        except BinariesUnavailable as exc:
            return _outcome(Verdict.SKIP, str(exc), details, start)
        dist = f"{impl.binaries['distribution']} {version}"
        details.update(distribution=dist, root=str(root), globs=declared_globs(impl.binaries, cell.cuda))
        if not files:
            globs = ", ".join(details["globs"])
            return _outcome(Verdict.FAIL, f"{dist} ships no file matching {globs}", details, start)
    if impl.binaries.get("loaded"):
        request = {"module": impl.module, "root": str(spec.root or ""), "binaries": impl.binaries}
        env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
        report = _child("opgate.validators.binsource", request, env)
        if report.get("error"):
            return _outcome(Verdict.ERROR, report["error"], details, start)
        files += [Path(p) for p in report["loaded"] if Path(p) not in files]
        details["loaded"] = report["loaded"]
        if not files:
            why = f"importing {impl.module} mapped no library with device code on this machine"
            return _outcome(Verdict.SKIP, why, details, start)
    return _judge_files(cell, impl, files, details, start)


def _judge_files(
    cell: Cell, impl: ImplSpec, files: list[Path], details: dict[str, Any], start: float
) -> CellOutcome:
    """Every file judged for the cell's arch; the cell takes the worst verdict."""
    from opgate.validators.binaries import kernels_by_arch, list_arches

    ptx = impl.ptx
    expect = tuple(impl.evidence_for("cuda", "eager").expect)
    per_file: list[dict[str, Any]] = []
    worst, lines = Verdict.PASS, []
    for path in files:
        found = list_arches(path)
        by_arch = kernels_by_arch(path) if found.has_device_code else {}
        status, summary, file_details = judge_binary(found, by_arch, [cell.arch], ptx, expect)
        per_file.append({"file": str(path), "status": status.value, "summary": summary, **file_details})
        if status is not Verdict.PASS:
            worst = Verdict.FAIL
        kernels = len(by_arch.get(cell.arch, []))
        lines.append(f"{path.name}: {summary}" + (f"; {kernels} kernels in {cell.arch}" if kernels else ""))
    details["files"] = per_file
    details["listing"] = "\n\n".join(f.get("listing", "") for f in per_file)
    bad = [ln for ln, f in zip(lines, per_file, strict=True) if f["status"] != Verdict.PASS.value]
    return _outcome(worst, "; ".join(bad or lines), details, start)


def _launched_triton_cell(
    cell: Cell, spec: OpSpec, impl: ImplSpec, workdir: Path, start: float
) -> CellOutcome:
    """Record the op's Triton launches on its sample inputs, then cross-compile them for the arch."""
    request = {
        "entry": impl.entry,
        "samples": spec.samples,
        "root": str(spec.root or ""),
        "dtypes": list(impl.dtypes),
        "shapes": [list(s) for s in spec.shapes["default"][:1]],
    }
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    report = _child("opgate.validators.checks.triton_launches", request, env)
    if report.get("error"):
        return _outcome(Verdict.ERROR, report["error"], {"recorded": report.get("launches")}, start)
    return _triton_cell(cell, impl, workdir, start, launches=report["launches"])
