"""The run modes: every fact about a mode, in one table.

A mode is how a cell runs the op (eager, under ``torch.compile``, replayed as a
CUDA graph, exported, AOT-compiled) or ``build`` (its binaries compiled and
inspected).  Each stage needs a few facts about it: the matrix which arches it
runs on and how long a cell takes (shard planning), the runner its timeout
and how far a worker process can be trusted after it, the worker which checks
to run, the reports which modes were timed and in which order to show them.
They are all here, one frozen :class:`Mode` per mode, so that adding a mode is
one entry here, its check, and its artifact (CONTRIBUTING.md, "Adding a mode").

Check names are the module names under ``opgate.validators.checks``; this
table names them without importing them (matrix imports no later stage).
The published ``compat.json`` carries :func:`to_json` so the dashboard reads
the modes' order and descriptions from the data instead of its own copy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

#: How far a worker process is trusted after a cell of the mode (see validators.device):
#: ``reuse`` the next cell shares the worker; ``isolate`` a fresh worker per cell.
WorkerPolicy = Literal["reuse", "isolate"]


@dataclass(frozen=True)
class Mode:
    """One mode and everything a stage needs to know about it."""

    name: str
    #: one line for readers (dashboard, docs): what a cell of this mode runs
    summary: str
    #: per-cell timeout (s) unless ``--timeout`` or an override says otherwise
    timeout_s: float
    #: expected seconds per cell when no history says otherwise (shard balancing)
    estimate_s: float
    #: check modules in run order (``opgate.validators.checks.<name>``); empty: the mode runs elsewhere
    checks: tuple[str, ...]
    #: cells only on GPU arches (a CPU device has no CUDA graphs, no nvcc target)
    gpu_only: bool = False
    #: binary evidence: one cell per op/impl/torch/cuda/arch (dtype/layout ``all``), a build worker, no device
    binaries: bool = False
    worker: WorkerPolicy = "reuse"
    #: the op runs inside a small producer/consumer graph (validators.checks.opgraph)
    in_graph: bool = False
    #: Inductor compiles the op's graph: its generated kernels (``triton_poi_*``...) can run
    #: beside the op's own (validators.checks.evidence, empty inputs)
    inductor: bool = False
    #: the mode's machinery can break independently of any op: an environment control runs
    #: the op's reference through it (validators.controls)
    controlled: bool = False
    #: the perf check also records the op's own timing history, not only the worth-it comparison
    perf_history: bool = False
    #: what the run breakdown counts the mode's own check (the check named like the mode) as
    category: str = "kernel runs"

    @property
    def timed(self) -> bool:
        """GPU cells of this mode are timed (the perf check runs)."""
        return "perf" in self.checks

    def to_json(self) -> dict[str, Any]:
        """The facts a reader of compat.json needs (the dashboard), not the runner's."""
        return {"name": self.name, "summary": self.summary, "gpu_only": self.gpu_only, "timed": self.timed}


_TABLE: tuple[Mode, ...] = (
    Mode(
        "eager",
        "the op called directly: numbers, gradients, opcheck, kernel evidence, SASS, perf",
        timeout_s=120.0,
        estimate_s=5.0,
        checks=(
            "mutation",
            "correctness",
            "gradients",
            "gradcheck",
            "opcheck",
            "fakemeta",
            "evidence",
            "sass",
            "perf",
        ),
        perf_history=True,
    ),
    Mode(
        "compile",
        "torch.compile(fullgraph) of the op inside a small graph: no breaks, no recompiles, same numbers",
        timeout_s=300.0,
        estimate_s=20.0,  # a first Inductor compile is ~17 s on CPU
        checks=("fakemeta", "compile", "correctness", "mutation", "evidence", "perf"),
        inductor=True,
        in_graph=True,
        controlled=True,
        perf_history=True,
        category="compile",
    ),
    Mode(
        "cudagraphs",
        'torch.compile(mode="reduce-overhead"): the CUDA graph must really replay, and the op in it',
        timeout_s=300.0,
        estimate_s=25.0,
        checks=("fakemeta", "cudagraphs", "correctness", "evidence", "perf"),
        inductor=True,
        gpu_only=True,
        # Shared workers, as eager and compile.  Cells of this mode once had a fresh worker
        # each: on the H200 (torch 2.11) misaligned-input cells raised "Detected N tensor(s) in
        # the cudagraph pool not tracked as outputs" in workers that had run other cells first.
        # The cause was opgate's launch-replay recorder keeping a recorded call's inputs alive
        # (fixed, tests/test_replay_attach.py), not the worker's history.  The graph trees are
        # reset between cells with the rest of Dynamo's state (validators.worker).  A fresh
        # worker cost ~3 s per cell, half of what re-validating one op took
        # (results/runs/h200-speed-warm-6).
        in_graph=True,
        controlled=True,
        category="compile",
    ),
    Mode(
        "export",
        "torch.export: the op node kept (also after run_decompositions()), the program's numbers",
        timeout_s=300.0,
        estimate_s=15.0,
        checks=("fakemeta", "export", "correctness", "mutation", "evidence"),
        in_graph=True,
        controlled=True,
        category="compile",
    ),
    Mode(
        "aoti",
        "AOTInductor: the exported op packaged, loaded and run as a deployment would",
        timeout_s=600.0,
        estimate_s=60.0,
        checks=("fakemeta", "aoti", "correctness", "mutation", "evidence"),
        inductor=True,
        worker="isolate",  # loaded .so files and loaders that segfault: nothing of it may reach the next cell
        controlled=True,
        category="compile",
    ),
    Mode(
        "build",
        "the binaries: nvcc / Triton cross-compile for the arch, SASS and PTX listed (no device)",
        timeout_s=900.0,
        estimate_s=90.0,  # a cold CUDA build is ~80 s
        checks=(),  # delegated to validators.checks.build.run_cell (nvcc, cuobjdump run in children)
        gpu_only=True,
        binaries=True,
        category="build",
    ),
)

#: name -> Mode, in the order cells, tables and the dashboard list them.
MODES: Mapping[str, Mode] = {m.name: m for m in _TABLE}
MODE_NAMES: tuple[str, ...] = tuple(MODES)


def mode(name: str) -> Mode:
    """The mode called ``name``; a KeyError naming the known ones otherwise."""
    try:
        return MODES[name]
    except KeyError:
        raise KeyError(f"unknown mode {name!r}; known: {', '.join(MODES)}") from None


def to_json() -> list[dict[str, Any]]:
    """Every mode's reader-facing facts, in order (compat.json ``modes``)."""
    return [m.to_json() for m in _TABLE]
