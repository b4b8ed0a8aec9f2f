"""A cell's limits: how long it may run and how much memory its worker may take.

The runner resolves both per cell (:func:`timeout_for`, :func:`memory_for`:
the command line, then the matrix's ``overrides``, then a default) and the
pool enforces the timeout; the memory limit is applied inside the worker
while the cell runs (:func:`limited`), and a cell that reaches it becomes an
error naming it (:func:`exhausted`, :func:`reason`).

Memory.

A runaway cell (an op allocating in a loop, a shape typo that asks for
terabytes) must cost that cell, not the host: without a limit the kernel's
OOM killer picks a victim, often the runner itself or another job.  While a
cell runs, its worker's ``RLIMIT_DATA`` (private writable memory: heap and
anonymous mappings, counted when mapped, not when touched) is lowered to the
cell's ``memory_mb`` (matrix ``overrides``, ``--memory-mb``, or the runner's
default), so a runaway allocation fails at once with ENOMEM inside the cell
instead of growing the process until the host gives out.  RLIMIT_DATA rather
than RLIMIT_AS: a CUDA context reserves terabytes of address space
(``PROT_NONE``, not data) and would not start under an address-space limit.

Only the soft limit moves, so the worker restores it after the cell.  The
limit is inherited by what the cell starts (Inductor's compile workers,
``nvcc``), each bounded on its own.  A cell whose checks report a host
allocation failure while the limit was in force becomes ``error`` naming the
limit, and its worker is retired (an allocator that failed mid-way may have
left state behind).
"""

from __future__ import annotations

import contextlib
import json
import resource
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from opgate.matrix.modes import MODES

if TYPE_CHECKING:
    from opgate.matrix.cell import Cell

#: Per-mode default timeouts (s), from :attr:`opgate.matrix.modes.Mode.timeout_s`.
DEFAULT_TIMEOUTS: Mapping[str, float] = {name: m.timeout_s for name, m in MODES.items()}
#: A worker's memory limit (MiB of private memory, RLIMIT_DATA) unless the matrix or --memory-mb says
#: otherwise: far above any real cell (a worker with torch imported holds ~300 MiB), far below a host.
DEFAULT_MEMORY_MB = 8192


def timeout_for(cell: Cell, cli_timeout: float | None) -> float:
    """``--timeout`` (this run, explicit) > the cell's ``timeout_s`` override > the mode default."""
    if cli_timeout is not None:
        return float(cli_timeout)
    override = cell.override("timeout_s")
    return float(override) if override is not None else DEFAULT_TIMEOUTS.get(cell.mode, 300.0)


def memory_for(cell: Cell, cli_memory_mb: int | None) -> int:
    """``--memory-mb`` > the cell's ``memory_mb`` override > :data:`DEFAULT_MEMORY_MB`."""
    if cli_memory_mb is not None:
        return int(cli_memory_mb)
    override = cell.override("memory_mb")
    return int(override) if override is not None else DEFAULT_MEMORY_MB


#: What an allocation failure on the host looks like in a check's report (Python, torch's
#: CPU allocator, C++, errno ENOMEM); "CUDA out of memory" is the GPU's own and not this limit.
_SIGNATURES = ("MemoryError", "can't allocate memory", "Cannot allocate memory", "std::bad_alloc")


@contextlib.contextmanager
def limited(memory_mb: int | None) -> Iterator[int | None]:
    """Lower this process's soft RLIMIT_DATA to ``memory_mb`` MiB while inside (bytes yielded)."""
    if not memory_mb:
        yield None
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    limit = int(memory_mb) << 20
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
    try:
        yield limit
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


def exhausted(outcome: Mapping[str, Any]) -> bool:
    """Does a cell's outcome report a host allocation failure?"""
    text = json.dumps(outcome, default=str)
    return any(sig in text for sig in _SIGNATURES) and "CUDA out of memory" not in text


def reason(memory_mb: int) -> str:
    return (
        f"memory limit: the cell needed more than {memory_mb} MiB of worker memory (RLIMIT_DATA); "
        "raise it with memory_mb in the matrix overrides or --memory-mb"
    )
