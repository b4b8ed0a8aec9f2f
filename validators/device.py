"""What this machine can run: which cells go to which kind of worker, and why the rest skip.

A matrix names every environment; one machine runs a slice of it.  Cells of
another torch major.minor belong to another nox session and are left out
entirely (not ``skip``: that torch's session reports them).  Everything else is
either placed on a worker kind or recorded ``skip`` with a reason a reader can
act on ("no sm_90 device here", "nvcc 12.9 not found").

Worker kinds, each its own process environment (see :mod:`validators.worker`):

* ``cpu``   arch ``cpu`` cells; ``TRITON_INTERPRET=1``, GPUs hidden.
* ``cuda``  ``sm_XX`` cells, one worker per visible GPU of that capability.
* ``build`` mode ``build`` cells: compile and inspect binaries, no device needed.
"""

from __future__ import annotations

import functools
import importlib
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from opgate.matrix.cell import Cell, torch_major_minor
from opgate.matrix.modes import mode as mode_of

#: How far a worker is trusted after a cell is the mode's ``worker`` policy
#: (:mod:`opgate.matrix.modes`): ``isolate`` (AOTInductor loaders that segfault,
#: loaded .so files, CUDA graph trees' process-wide state) gets a fresh worker per
#: cell.  ``build`` cells are reused: nvcc, Triton's
#: cross-compile and cuobjdump all run in child processes, so a build worker's
#: own state never changes.


@dataclass(frozen=True)
class Gpu:
    """One visible GPU, as the probe saw it (index is the CUDA_VISIBLE_DEVICES value)."""

    index: int
    name: str
    capability: str  # "9.0"

    @property
    def arch(self) -> str:
        return "sm_" + self.capability.replace(".", "")


@dataclass(frozen=True)
class Placement:
    """Where a cell runs (``kind``) or why it cannot (``skip_reason``)."""

    kind: str | None  # "cpu" | "cuda" | "build" | None (skip)
    skip_reason: str = ""
    arch: str = "cpu"  # cuda cells: GPUs with this arch may run it
    isolate: bool = False


def installed_torch() -> str | None:
    """The running interpreter's torch version, read without importing torch."""
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def installed_torch_cuda() -> str | None:
    """The CUDA version the installed torch was built for (None: a CPU-only build), without importing it.

    Read from ``torch/version.py`` (``cuda: Optional[str] = '13.0'``), so a build
    cell that cannot exist here (a CUDA extension for a CPU-only torch) is a
    skip decided before any worker starts.  "" when it cannot be told.
    """
    import importlib.util
    import re

    try:
        spec = importlib.util.find_spec("torch")
        text = Path(spec.origin).with_name("version.py").read_text() if spec and spec.origin else ""
    except (ImportError, OSError, ValueError):
        return ""
    found = re.search(r"^cuda\s*(?::[^=\n]*)?=\s*(.+?)\s*$", text, re.MULTILINE)
    if found is None:
        return ""
    value = found.group(1).strip("'\"")
    return None if value == "None" else value


def is_this_torch(cell: Cell, torch_version: str | None) -> bool:
    """Cells of another torch major.minor belong to another environment's run."""
    return torch_version is not None and torch_major_minor(cell.torch) == torch_major_minor(torch_version)


def gpu_hardware_possible() -> bool:
    """Cheap pre-check, so a CPU-only machine never pays for a CUDA probe."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    return Path("/dev/nvidiactl").exists() or shutil.which("nvidia-smi") is not None


def gpus_from_fingerprint(fp: Mapping[str, Any]) -> list[Gpu]:
    return [Gpu(int(g["index"]), str(g["name"]), str(g["capability"])) for g in fp.get("gpus") or []]


def missing_distributions(requires: Sequence[str]) -> list[str]:
    """Distributions from an implementation's ``requires:`` that are not installed here."""
    return [dist for dist in requires if not _installed(dist)]


@functools.cache
def _installed(dist: str) -> bool:
    """Asked per cell; the answer cannot change within a run (a metadata scan costs ~1 ms)."""
    try:
        metadata.distribution(dist)
    except metadata.PackageNotFoundError:
        return False
    return True


NvccFinder = Callable[[str], "str | os.PathLike[str] | None"]


def default_nvcc_finder() -> NvccFinder | None:
    """``validators.toolchain.provide_nvcc`` (finds or installs) when the toolchain module is present."""
    try:
        toolchain = importlib.import_module("opgate.validators.toolchain")
    except ImportError:
        return None
    finder: NvccFinder | None = getattr(toolchain, "provide_nvcc", None)
    return finder


def _memoized(finder: NvccFinder, versions: Sequence[str]) -> NvccFinder:
    """``finder`` answered once per version, the given versions looked up in parallel threads."""
    from concurrent.futures import ThreadPoolExecutor

    def ask(version: str) -> tuple[str | os.PathLike[str] | None, Exception | None]:
        try:
            return finder(version), None
        except Exception as exc:  # noqa: BLE001 - re-raised to each caller, as the finder would
            return None, exc

    with ThreadPoolExecutor(max_workers=max(1, len(versions))) as pool:
        answers = dict(zip(versions, pool.map(ask, versions), strict=True))

    def memo(version: str) -> str | os.PathLike[str] | None:
        if version not in answers:
            answers[version] = ask(version)
        found, exc = answers[version]
        if exc is not None:
            raise exc
        return found

    return memo


def find_nvcc(version: str, finder: NvccFinder | None) -> tuple[str | None, str]:
    """(path, "") when the cell's nvcc exists here, else (None, reason)."""
    if finder is None:
        return None, f"nvcc {version}: no build toolchain support here (validators.toolchain missing)"
    try:
        found = finder(version)
    except Exception as exc:  # noqa: BLE001 - any lookup failure is a reason to skip, said in full
        return None, f"nvcc {version} not available: {exc}"
    if not found:
        return None, f"nvcc {version} not found here"
    return os.fspath(found), ""


def place(
    cell: Cell,
    gpus: Sequence[Gpu],
    requires: Sequence[str] = (),
    nvcc_finder: NvccFinder | None = None,
) -> Placement:
    """Decide where ``cell`` runs on this machine (the torch filter is applied before)."""
    missing = missing_distributions(requires)
    if missing:
        return Placement(None, f"requires {', '.join(missing)} (not installed here)")
    policy = mode_of(cell.mode)
    isolate = policy.worker == "isolate" or bool(cell.override("isolate", False))
    if policy.binaries:
        path, reason = find_nvcc(cell.cuda, nvcc_finder)
        if path is None:
            return Placement(None, reason)
        return Placement("build", arch=cell.arch, isolate=isolate)
    if cell.arch == "cpu":
        return Placement("cpu", isolate=isolate)
    if not any(g.arch == cell.arch for g in gpus):
        return Placement(None, f"no {cell.arch} device here")
    return Placement("cuda", arch=cell.arch, isolate=isolate)


def default_jobs() -> int:
    """Host workers: one per core on small machines, half the cores on larger ones.

    A CPU cell is mostly single-threaded (the Triton interpreter, Dynamo tracing),
    so on a 2-core runner two workers nearly halve the wall time (measured: the
    default matrix's 365 CPU cells in 141 s with 2 workers); on larger machines
    each worker keeps a second core for torch's intra-op threads and gcc.
    """
    cores = os.cpu_count() or 1
    return cores if cores <= 4 else cores // 2


def threads_per_worker(jobs: int) -> int:
    return max(1, (os.cpu_count() or 1) // max(1, jobs))


@dataclass
class MachineShare:
    """This machine's share of the cells: what runs where, what skips and why.

    Not the CI shard plan (:class:`opgate.matrix.plan.Plan`, which splits the matrix across
    machines): this is what one ``opgate run`` does with the cells it was given.
    """

    cells: list[Cell] = field(default_factory=list)  # this torch's cells, in matrix order
    placements: dict[str, Placement] = field(default_factory=dict)
    other_torch: int = 0  # left out: another torch session runs them
    nvcc: dict[str, str] = field(default_factory=dict)  # cuda version -> nvcc found for build cells


def plan_cells(
    cells: Sequence[Cell],
    specs: Mapping[str, Any],
    torch_version: str | None,
    gpus: Sequence[Gpu],
    nvcc_finder: NvccFinder | None,
    *,
    torch_cuda: str | None = "",
) -> MachineShare:
    """Leave out other torch versions' cells; place or skip the rest (see :func:`place`).

    ``torch_cuda`` is :func:`installed_torch_cuda` (None: a CPU-only torch, whose
    CUDA C++ build cells skip here; "": unknown).

    Each CUDA version's nvcc is looked up once (a look-up runs nvcc twice), all
    versions at once, not once per build cell.
    """
    plan = MachineShare()
    cpu_only = torch_cuda is None
    mine = [c for c in cells if is_this_torch(c, torch_version)]
    versions = sorted({c.cuda for c in mine if c.mode == "build"})
    finder = _memoized(nvcc_finder, versions) if nvcc_finder is not None else None
    for cell in cells:
        if not is_this_torch(cell, torch_version):
            plan.other_torch += 1
            continue
        impl = specs[cell.op].implementations.get(cell.impl) if cell.op in specs else None
        placement = place(cell, gpus, list(getattr(impl, "requires", []) or []), finder)
        if placement.kind == "build" and cpu_only and getattr(impl, "kind", "") == "cuda":
            reason = f"torch {torch_version} is CPU-only: no CUDA extension can be built for it"
            placement = Placement(None, reason)  # the build check says the same, in a worker
        if placement.kind == "build" and cell.cuda not in plan.nvcc:
            plan.nvcc[cell.cuda] = find_nvcc(cell.cuda, finder)[0] or ""
        plan.cells.append(cell)
        plan.placements[cell.id] = placement
    return plan
