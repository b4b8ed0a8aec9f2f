"""What a mode actually runs: the eager op, a compiled function, an exported or AOTI-packaged program.

Every mode's correctness and evidence checks call the op through its
artifact, so "correct under torch.compile" means the compiled function's
numbers, not the eager op's.  An artifact is built lazily, once per cell (one
compiled function is shared by every shape, which is what makes the recompile
count meaningful); a build failure (a graph break under ``fullgraph``, an
export error) is remembered and raised as :class:`ArtifactError`, which
the mode's own check reports as a failure and the dependent checks as a skip.

Compiled, CUDA-graphed and exported artifacts hold the op inside a small
graph with a producer and a consumer (:mod:`validators.checks.opgraph`); the
cell's reference runs through the same context.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree

from opgate.ops.base import SampleInput
from opgate.validators.checks.base import describe_exception
from opgate.validators.checks.opgraph import Plan, graph_inputs, graph_of, plan
from opgate.validators.profiling import harness


class ArtifactError(RuntimeError):
    """The mode's artifact could not be built (the mode's own check says why)."""


def is_compile_failure(exc: BaseException) -> bool:
    """True for errors raised by Dynamo/Inductor while compiling, not by the op at run time."""
    from torch._dynamo.exc import TorchDynamoException

    return isinstance(exc, TorchDynamoException)


def _key(sample: SampleInput) -> str:
    parts = [
        f"{a.dtype}{list(a.shape)}s{list(a.stride())}o{a.storage_offset()}"
        for a in sample.args
        if isinstance(a, torch.Tensor)
    ]
    return "|".join(parts)


class Artifact:
    """Calls the op as this mode runs it; ``failure`` is set once a build has failed."""

    mode = "eager"

    def __init__(self, op: Callable[..., Any]) -> None:
        self.op = op
        self.failure: str | None = None

    def __call__(self, sample: SampleInput) -> Any:
        return self.op(*sample.args, **sample.kwargs)


def _graph_args(sample: SampleInput) -> tuple[Plan, tuple[Any, ...]]:
    """(plan, positional graph inputs): the producer's inputs are prepared as harness work."""
    which = plan(sample)
    with harness("graph-inputs"):
        return which, graph_inputs(sample, which)


class Compiled(Artifact):
    """``torch.compile(graph, fullgraph=True)`` of the op in its graph, dynamic when the spec says so."""

    mode = "compile"
    compile_mode: str | None = None

    def __init__(self, op: Callable[..., Any], dynamic: bool, *, in_graph: bool = True) -> None:
        super().__init__(op)
        self.dynamic = dynamic
        self.in_graph = in_graph
        self.graph = graph_of(op)
        self.fn = torch.compile(
            self.graph if in_graph else op,
            fullgraph=True,
            dynamic=True if dynamic else None,
            mode=self.compile_mode,
        )
        self.compiled_once = False

    def _call(self, sample: SampleInput) -> Any:
        if not self.in_graph:
            return self.fn(*sample.args, **sample.kwargs)
        which, args = _graph_args(sample)
        return self.fn(which, *args, **sample.kwargs)

    def __call__(self, sample: SampleInput) -> Any:
        if self.failure is not None:
            raise ArtifactError(self.failure)
        try:
            out = self._call(sample)
        except Exception as exc:
            if is_compile_failure(exc):
                self.failure = describe_exception(exc)
                raise ArtifactError(self.failure) from exc
            raise
        self.compiled_once = True
        return out


class CudaGraphed(Compiled):
    """``mode="reduce-overhead"``: outputs live in the graph's pool; cloned before the next replay."""

    mode = "cudagraphs"
    compile_mode = "reduce-overhead"

    def __call__(self, sample: SampleInput) -> Any:
        torch.compiler.cudagraph_mark_step_begin()
        out = super().__call__(sample)
        with harness("cudagraph-outputs"):  # outputs live in the graph's pool until the next replay
            return pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, out)


class _TensorArgs(torch.nn.Module):
    """Exports ``fn`` with its tensor arguments as inputs and everything else baked in.

    ``which`` (a :func:`validators.checks.opgraph.plan`) puts the op inside its
    graph; None exports the op alone.
    """

    def __init__(self, op: Callable[..., Any], sample: SampleInput, which: Plan | None) -> None:
        super().__init__()
        self.op = op if which is None else graph_of(op)
        self.which = which
        self.template = list(sample.args)
        self.slots = [i for i, a in enumerate(sample.args) if isinstance(a, torch.Tensor)]
        self.kwargs = dict(sample.kwargs)

    def forward(self, *tensors: torch.Tensor) -> Any:
        args = list(self.template)
        for i, t in zip(self.slots, tensors, strict=True):
            args[i] = t
        if self.which is None:
            return self.op(*args, **self.kwargs)
        return self.op(self.which, *args, **self.kwargs)


def tensor_args(sample: SampleInput) -> tuple[torch.Tensor, ...]:
    return tuple(a for a in sample.args if isinstance(a, torch.Tensor))


class Exported(Artifact):
    """``torch.export.export`` per input signature (shape, strides, dtype); runs ``ep.module()``.

    ``decomposed`` runs the same program after ``ep.run_decompositions()``, the
    form AOTInductor and ExecuTorch lower (a CompositeImplicitAutograd op
    survives ``torch.export`` as a node and is decomposed there).
    """

    mode = "export"
    #: whether the op is exported inside its graph (:mod:`validators.checks.opgraph`)
    in_graph = True

    def __init__(self, op: Callable[..., Any]) -> None:
        super().__init__(op)
        self.programs: dict[str, torch.export.ExportedProgram] = {}
        self.decomposed_programs: dict[str, torch.export.ExportedProgram] = {}
        self._modules: dict[tuple[str, bool], Callable[..., Any]] = {}

    def program(self, sample: SampleInput) -> torch.export.ExportedProgram:
        key = _key(sample)
        if key not in self.programs:
            if self.failure is not None:
                raise ArtifactError(self.failure)
            which = plan(sample) if self.in_graph else None
            inputs = graph_inputs(sample, which) if which is not None else sample.args
            try:
                self.programs[key] = torch.export.export(
                    _TensorArgs(self.op, sample, which), tensor_args(SampleInput(args=tuple(inputs)))
                )
            except Exception as exc:
                self.failure = f"torch.export failed: {describe_exception(exc)}"
                raise ArtifactError(self.failure) from exc
        return self.programs[key]

    def decomposed(self, sample: SampleInput) -> torch.export.ExportedProgram:
        """The program after ``run_decompositions()`` (the default decomposition table)."""
        key = _key(sample)
        if key not in self.decomposed_programs:
            ep = self.program(sample)
            try:
                self.decomposed_programs[key] = ep.run_decompositions()
            except Exception as exc:
                self.failure = f"run_decompositions() failed: {describe_exception(exc)}"
                raise ArtifactError(self.failure) from exc
        return self.decomposed_programs[key]

    def _run(self, sample: SampleInput, decomposed: bool) -> Any:
        key = (_key(sample), decomposed)
        if key not in self._modules:
            ep = self.decomposed(sample) if decomposed else self.program(sample)
            self._modules[key] = ep.module()
        if self.in_graph:
            _, args = _graph_args(sample)
            return self._modules[key](*tensor_args(SampleInput(args=args)))
        return self._modules[key](*tensor_args(sample))

    def __call__(self, sample: SampleInput) -> Any:
        return self._run(sample, decomposed=False)

    def run_decomposed(self, sample: SampleInput) -> Any:
        """Run the program ``run_decompositions()`` made of it (see :meth:`decomposed`)."""
        return self._run(sample, decomposed=True)


class Aoti(Exported):
    """AOTInductor: export, ``aoti_compile_and_package`` into the cell's workdir, load, run."""

    mode = "aoti"
    in_graph = False

    def __init__(self, op: Callable[..., Any], workdir: Path) -> None:
        super().__init__(op)
        self.workdir = workdir
        self.loaded: dict[str, Callable[..., Any]] = {}
        self.packages: dict[str, str] = {}

    def runner(self, sample: SampleInput) -> Callable[..., Any]:
        key = _key(sample)
        if key not in self.loaded:
            ep = self.program(sample)
            try:
                path = self.workdir / f"aoti-{len(self.loaded)}.pt2"
                self.workdir.mkdir(parents=True, exist_ok=True)
                pkg = torch._inductor.aoti_compile_and_package(ep, package_path=str(path))
                self.packages[key] = str(pkg)
                self.loaded[key] = torch._inductor.aoti_load_package(str(pkg))
            except Exception as exc:
                self.failure = f"AOTInductor package/load failed: {describe_exception(exc)}"
                raise ArtifactError(self.failure) from exc
        return self.loaded[key]

    def __call__(self, sample: SampleInput) -> Any:
        return self.runner(sample)(*tensor_args(sample))


#: How each mode runs the op: its artifact, built from (op, dynamic shapes?, work folder).
#: Modes not listed (eager) call the op directly.  A new mode adds its artifact here.
ARTIFACTS: Mapping[str, Callable[[Callable[..., Any], bool, Path], Artifact]] = {
    "compile": lambda op, dynamic, workdir: Compiled(op, dynamic),
    "cudagraphs": lambda op, dynamic, workdir: CudaGraphed(op, dynamic),
    "export": lambda op, dynamic, workdir: Exported(op),
    "aoti": lambda op, dynamic, workdir: Aoti(op, workdir),
}


def make_artifact(mode: str, op: Callable[..., Any], dynamic: bool, workdir: Path) -> Artifact:
    factory = ARTIFACTS.get(mode)
    return Artifact(op) if factory is None else factory(op, dynamic, workdir)
