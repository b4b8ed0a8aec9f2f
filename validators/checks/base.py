"""The one interface every check implements, and the guard that runs it.

A check answers two questions about a cell: does it apply here
(``applies(ctx) -> None`` or the reason it does not), and what did it find
(``run(ctx) -> CheckResult``).  :func:`run_check` is the only caller: it turns
"does not apply" into a ``skip`` result that still names the reason (reports
show why a check did not run), and any Python exception escaping a check into
an ``error`` result with the exception's type and message, so one broken check
or one crashing op never takes the other checks of the cell down.
"""

from __future__ import annotations

import re
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from opgate.validators.checks import torchlog
from opgate.validators.result import CheckResult, Verdict

if TYPE_CHECKING:
    from opgate.validators.checks.context import CellContext

#: What to do about an op without a backward, in opgate's terms: PyTorch's own message
#: ("... use register_autograd ...") never says that a forward-only op can say so instead.
NO_BACKWARD_HINT = (
    "a forward-only op declares SampleInput(grad_args=()) in its sample inputs; "
    "an op with a backward registers it with torch.library.register_autograd"
)
#: Substrings of PyTorch errors that mean "this op has no autograd formula".
NO_BACKWARD_MESSAGES = (
    "no autograd formula was registered",
    "Autograd kernel was not registered",
    "does not require grad and does not have a grad_fn",
)


@dataclass(frozen=True)
class Check:
    """A named check: ``applies`` returns None when it applies, else why not."""

    name: str
    applies: Callable[[CellContext], str | None]
    run: Callable[[CellContext], CheckResult]


def always(ctx: CellContext) -> str | None:
    """``applies`` for checks that apply wherever the dispatch table puts them."""
    return None


#: Where the informative part of a PyTorch message ends: stacks, logging advice, links, debug dumps.
_MESSAGE_ENDS = re.compile(
    r"^(from user code:|Set TORCH|For (more|extended|even more|C\+\+)|User Stack|Developer debug context"
    r"|If you suspect|You can suppress|The above exception|Traceback|While executing|Original traceback)"
)
#: Lines inside the informative part that are stack frames or source carets, not prose.
_FRAME = re.compile(r'^(File "|\(snipped|\^+$|~+$)')
#: Wrappers kept between an exception and its root cause (the root is always kept).
MAX_CAUSES = 2


def _message_lines(exc: BaseException) -> list[str]:
    """The informative lines of one exception's message: the first, then its explanation and hints."""
    lines: list[str] = []
    for raw in str(exc).strip().splitlines():
        line = raw.strip()
        if not line:
            continue
        if lines and _MESSAGE_ENDS.match(line):
            break
        if not _FRAME.match(line):
            lines.append(line)
    return lines


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc``, the exceptions it was raised from, the root cause last.

    The cause, else the implicit context, even where a wrapper suppressed it
    for display: Dynamo raises ``TorchRuntimeError(...) from None`` around the
    very error whose message names the fix.
    """
    seen = {id(exc)}
    chain = [exc]
    while True:
        current = chain[-1]
        nxt = current.__cause__ if current.__cause__ is not None else current.__context__
        if nxt is None or id(nxt) in seen:
            return chain
        seen.add(id(nxt))
        chain.append(nxt)


def describe_exception(exc: BaseException, limit: int = 900) -> str:
    """``Type: first line (caused by Root: its message); explanation; hint`` within ``limit`` characters.

    Dynamo and Inductor wrap the error that matters: "RuntimeError when making
    fake tensor call" carries, as its root cause, PyTorch's actionable message
    ("Cannot access data pointer of Tensor (e.g. FakeTensor ...) ... wrap the
    custom kernel into an opaque custom op"), and after its first line the
    explanation and hint ("Explanation: ... There was no fake impl registered
    ... Please use `register_fake`" / "Hint: ...").  All of it is kept, the
    root cause right after the first line; stacks and logging advice are
    dropped.  The full traceback goes to the cell log.
    """
    chain = _chain(exc)
    outer, root = chain[0], chain[-1]
    lines = _message_lines(outer)
    text = f"{type(outer).__name__}: {lines[0]}" if lines else type(outer).__name__
    root_lines = _message_lines(root) if root is not outer else []
    if root_lines and root_lines != lines:
        text += f" (caused by {type(root).__name__}: {'; '.join(root_lines)})"
    rest = lines[1:] + [ln for e in chain[1:-1][:MAX_CAUSES] for ln in _message_lines(e)]
    rest = [ln for ln in dict.fromkeys(rest) if ln not in text]
    if rest:
        text += "; " + "; ".join(rest)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def error_result(name: str, exc: BaseException, what: str = "") -> CheckResult:
    """A check that crashed: ``error`` with the exception; the traceback is printed for the log."""
    traceback.print_exception(type(exc), exc, exc.__traceback__)
    prefix = f"{what}: " if what else ""
    return CheckResult(
        name=name,
        status=Verdict.ERROR,
        summary=prefix + describe_exception(exc),
        details={"exception": type(exc).__name__, "message": str(exc)[:4000]},
    )


def run_check(check: Check, ctx: CellContext) -> CheckResult:
    """Run one check under the guard: skip with a reason, or its result, or ``error``."""
    t0, waited_before = time.perf_counter(), waited_s()
    try:
        reason = check.applies(ctx)
        if reason is not None:
            result = CheckResult(name=check.name, status=Verdict.SKIP, summary=reason)
        else:
            result = check.run(ctx)
    except Exception as exc:  # noqa: BLE001 - a crashing check or op is this check's error, nothing more
        result = error_result(check.name, exc)
    result.duration_s = round(time.perf_counter() - t0, 4)
    charge_waits(result, waited_before)
    return with_hints(result)


def waited_s() -> float:
    """Seconds this worker has spent blocked on another process's build or Triton compile so far."""
    from opgate.validators import tritoncache
    from opgate.validators.cuda_build import BUILD_WAIT_SECONDS

    return BUILD_WAIT_SECONDS[0] + tritoncache.WAIT_SECONDS[0]


def charge_waits(result: CheckResult, waited_before: float) -> None:
    """Record on ``result`` what this worker waited since ``waited_s()`` read ``waited_before``."""
    waited = waited_s() - waited_before
    if waited >= 0.0005:
        result.waited_s = round(min(waited, result.duration_s), 3)


def with_hints(result: CheckResult) -> CheckResult:
    """A failed or crashed check whose cause opgate can name gets the fix in its summary.

    It also carries what torch warned while the cell ran (:mod:`torchlog`): the cause of
    an Inductor crash can be in a warning logged by an earlier check's compile.
    """
    if result.status not in (Verdict.FAIL, Verdict.ERROR):
        return result
    if NO_BACKWARD_HINT not in result.summary:
        text = f"{result.summary} {result.details.get('message', '')}"
        if any(m in text for m in NO_BACKWARD_MESSAGES):
            result.summary = f"{result.summary} ({NO_BACKWARD_HINT})"
    lines = torchlog.logged()
    if lines:
        result.details.setdefault("torch_logged", lines)
        found = torchlog.hint(lines)
        if found is not None and found not in result.summary:
            result.summary = f"{result.summary} ({found})"
    return result
