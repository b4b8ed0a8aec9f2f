"""Attempts -> one cell verdict: re-run failures once in a fresh process, call flaky what recovers.

A cell that fails or crashes may be broken, or may have met a bad process
state (a stale cache, a leaked CUDA context, an uninitialised buffer that
happened to be zero).  Running it again in a fresh worker with the same seed
separates the two: fail-then-pass is ``flaky`` (a defect in its own right,
reported with both attempts), fail-twice stays ``fail``.  Timeouts are not
re-run: a hang would cost its whole timeout again and prove nothing new.

``flaky`` is kept for nondeterminism of the cell itself.  A worker killed from
outside (SIGKILL from the OOM killer or an operator, a fork server that died
under it) says nothing about the op: that cell is ``error`` naming the
signal, and the re-run's verdict is recorded next to it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from opgate.validators.pool import Attempt
from opgate.validators.result import CheckResult, Verdict, combine

#: Verdicts worth a second attempt: a fallback or an unsupported refusal is deterministic evidence.
RETRY_VERDICTS = frozenset({Verdict.FAIL, Verdict.ERROR})


@dataclass
class AttemptView:
    """An attempt's outcome as result objects."""

    verdict: Verdict
    checks: list[CheckResult]
    kernels: list[str]
    reason: str
    duration_s: float
    timed_out: bool = False
    retryable: bool = True
    external: bool = False
    setup_build_s: float = 0.0  # of duration_s: the set-up's CUDA build (CellOutcome.setup_build_s)
    setup_wait_s: float = 0.0  # of duration_s: the set-up blocked on another process's build

    @classmethod
    def of(cls, attempt: Attempt) -> AttemptView:
        """Rebuild result objects; an outcome that does not parse is this cell's ``error``, not the run's."""
        out = attempt.outcome
        retryable = attempt.retryable and not attempt.timed_out
        try:
            checks = [CheckResult.from_json(c) for c in out.get("checks") or []]
            raw = out.get("verdict")
            verdict = Verdict(raw) if raw else combine(checks)
        except (KeyError, TypeError, ValueError) as exc:
            reason = f"malformed outcome from the worker: {type(exc).__name__}: {exc}"
            return cls(Verdict.ERROR, [], [], reason, attempt.duration_s, attempt.timed_out, retryable)
        reason = str(out.get("reason") or "")
        if not raw and not checks:
            reason = reason or "no check ran"
        kernels = [str(k) for k in out.get("kernels") or []]
        return cls(
            verdict,
            checks,
            kernels,
            reason,
            attempt.duration_s,
            timed_out=attempt.timed_out,
            retryable=retryable,
            external=attempt.external,
            setup_build_s=float(out.get("setup_build_s") or 0.0),
            setup_wait_s=float(out.get("setup_wait_s") or 0.0),
        )

    def summary(self) -> str:
        """One line: the reason, else the failing checks' summaries."""
        if self.reason:
            return self.reason
        bad = [f"{c.name}: {c.summary}" for c in self.checks if c.status.is_bad or c.status is Verdict.ERROR]
        return "; ".join(bad)[:400] or self.verdict.value


def wants_retry(view: AttemptView, attempt_no: int, retries: int) -> bool:
    """Failures and crashes get a fresh process; timeouts do not (a hang costs its timeout again)."""
    return view.verdict in RETRY_VERDICTS and view.retryable and attempt_no <= retries


def merge_attempts(views: Sequence[AttemptView]) -> tuple[Verdict, list[CheckResult], list[str], str]:
    """(verdict, checks, kernels, reason) of a cell from its attempts, in order.

    A later attempt that is not bad makes the cell ``flaky``: the passing
    attempt's checks are kept and each failed attempt is recorded as a check
    ``attempt_N`` (its verdict and summary; its checks in ``details``) -- unless
    every failed attempt was a worker killed from outside: then ``error``,
    with the kill as the reason.  Failing again keeps the first attempt's
    verdict and records the re-runs.
    """
    first, last = views[0], views[-1]
    if len(views) == 1:
        return first.verdict, first.checks, first.kernels, first.reason

    def as_check(n: int, v: AttemptView) -> CheckResult:
        details = {"reason": v.reason, "kernels": v.kernels, "checks": [c.to_json() for c in v.checks]}
        return CheckResult(f"attempt_{n}", v.verdict, v.summary(), details, v.duration_s)

    if not last.verdict.is_bad and last.verdict is not Verdict.SKIP:
        failed = [as_check(n, v) for n, v in enumerate(views[:-1], 1)]
        if all(v.external for v in views[:-1]):
            reason = f"{first.summary()} (re-run in a fresh worker: {last.verdict.value})"
            return Verdict.ERROR, [*last.checks, *failed], last.kernels, reason
        reason = (
            f"flaky: attempt 1 {first.verdict.value} ({first.summary()}); "
            f"attempt {len(views)} {last.verdict.value}"
        )
        return Verdict.FLAKY, [*last.checks, *failed], last.kernels, reason
    reruns = [as_check(n, v) for n, v in enumerate(views[1:], 2)]
    again = (
        "same on re-run"
        if all(v.verdict is first.verdict for v in views)
        else f"re-run: {last.verdict.value}"
    )
    return first.verdict, [*first.checks, *reruns], first.kernels, f"{first.summary()} ({again})"
