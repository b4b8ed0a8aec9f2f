"""cudagraphs: ``torch.compile(mode="reduce-overhead")`` must really replay CUDA graphs.

Inductor silently falls back to plain launches when it cannot graph a
function (CPU tensors, mutated inputs, ops it cannot capture), logging a
perf hint and bumping ``counters["inductor"]["cudagraph_skips"]``.  A skip
leaves the numbers right but the mode's point gone, so it is a ``fallback``,
with the perf-hint messages as the listing.  Each shape is called three times
(warm-up, record, replay), as cudagraph trees need.  The function is the op
inside its graph (:mod:`validators.checks.opgraph`); the evidence check then
profiles a replay and reads the kernels of the captured graph.
"""

from __future__ import annotations

from typing import Any

from opgate.ops.base import SampleInput
from opgate.validators.checks import torchlog
from opgate.validators.checks.artifacts import ArtifactError, CudaGraphed
from opgate.validators.checks.base import Check, describe_exception
from opgate.validators.checks.context import CellContext
from opgate.validators.result import CheckResult, Verdict

NAME = "cudagraphs"
CALLS_PER_SHAPE = 3


def skips() -> int:
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["cudagraph_skips"])


def _replay(artifact: CudaGraphed, sample: SampleInput) -> str:
    """Warm-up, record, replay; "" or the op's run-time error (correctness reports it in full)."""
    try:
        for _ in range(CALLS_PER_SHAPE):
            artifact(sample)
    except ArtifactError:
        raise
    except Exception as exc:  # noqa: BLE001 - op crash: correctness reports it
        return describe_exception(exc)
    return ""


def applies(ctx: CellContext) -> str | None:
    if ctx.device_kind != "cuda":
        return "CUDA graphs need a CUDA device"
    if not isinstance(ctx.artifact, CudaGraphed):
        return f"mode {ctx.mode} does not use CUDA graphs"
    if ctx.artifact.failure is not None:
        return f"not compiled: {ctx.artifact.failure}"
    return None


def run(ctx: CellContext) -> CheckResult:
    artifact = ctx.artifact
    assert isinstance(artifact, CudaGraphed)
    before = skips()
    runtime_errors: list[str] = []
    try:
        with torchlog.collecting() as logged:  # what torch warned while the graphs were made
            for shape, sample in zip(ctx.shapes, ctx.inputs(), strict=True):
                error = _replay(artifact, sample)
                if error:
                    runtime_errors.append(f"shape {list(shape)}: {error}")
    except ArtifactError as exc:
        return CheckResult(NAME, Verdict.FAIL, f"reduce-overhead compile failed: {exc}")
    n = skips() - before
    details: dict[str, Any] = {
        "cudagraph_skips": n,
        "messages": [line for line in logged if "cudagraph" in line.lower()],
        "runtime_errors": runtime_errors,
    }
    if n:
        return CheckResult(NAME, Verdict.FALLBACK, f"CUDA graphs skipped {n} time(s)", details)
    return CheckResult(NAME, Verdict.PASS, "replayed as CUDA graphs, no skips", details)


CHECKS = (Check(NAME, applies, run),)
