"""``opgate alert``: deliver a diff's regressions to one chat platform.

Secrets come from environment variables only (``Platform.url_env`` and
``secret_env``); nothing here accepts them as arguments, so they never reach
a process listing or a shell history.  An alert that cannot be delivered raises
:class:`AlertDeliveryFailed` (its own exit code): the validation verdict and
every published file stay as they are.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from opgate.matrix.errors import AlertDeliveryFailed, UsageError
from opgate.reports.alerts.dedup import STATE_PROBLEM, DedupState
from opgate.reports.alerts.message import Alert, from_diff
from opgate.reports.alerts.registry import PLATFORMS, Platform
from opgate.reports.alerts.transport import Redactor, RetryPolicy, check_url, post_json, redact_url


def default_run_id(doc: Mapping[str, Any], env: Mapping[str, str]) -> str:
    """``GITHUB_RUN_ID`` (stable across re-runs of a workflow), else the head's publish time."""
    return env.get("GITHUB_RUN_ID") or f"head@{doc['head']['generated_at']}"


def send(
    doc: Mapping[str, Any],
    platform_name: str,
    env: Mapping[str, str],
    *,
    run_id: str | None = None,
    report_url: str = "",
    dashboard_url: str = "",
    state_path: Path | None = None,
    state_required: bool = True,
    policy: RetryPolicy | None = None,
    log: TextIO | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Send what is new; return the number of regressions delivered (0: nothing to do).

    ``state_path`` None: no dedup state (say so).  ``state_required`` False
    (the default location, not one the user named): a state that cannot be
    read or written is skipped with a warning instead of refusing the alert.
    """
    log = log if log is not None else sys.stderr
    platform = PLATFORMS.get(platform_name)
    if platform is None:
        raise UsageError(f"unknown platform {platform_name!r}; choose from {', '.join(PLATFORMS)}")
    url = env.get(platform.url_env, "")
    if not url:
        raise UsageError(f"{platform.url_env} is not set: the {platform.name} webhook URL comes from it")
    check_url(url, platform.url_env)
    secret = env.get(platform.secret_env, "") if platform.secret_env else ""
    redactor = Redactor()
    redactor.add_url(url)
    redactor.add(secret)
    if platform.secret_env and not secret:
        log.write(f"opgate alert: {platform.secret_env} is not set; sending unsigned\n")

    alert = from_diff(doc, run_id or default_run_id(doc, env), report_url, dashboard_url)
    if state_path is None:
        log.write("opgate alert: no alert state: a re-run posts the same regressions again\n")
    delivery = _Delivery(platform, alert, url, secret, redactor, policy, sleep, log)
    try:
        with DedupState.locked(state_path) as state:
            return delivery.to(state)
    except AlertDeliveryFailed as exc:
        if state_path is None or state_required or not exc.message().startswith(STATE_PROBLEM):
            raise
        log.write(f"opgate alert: {exc.message().split('; ')[0]}; sending without a state\n")
    return delivery.to(DedupState(None))


@dataclass
class _Delivery:
    platform: Platform
    alert: Alert
    url: str
    secret: str
    redactor: Redactor
    policy: RetryPolicy | None
    sleep: Callable[[float], None]
    log: TextIO

    def to(self, state: DedupState) -> int:
        """Post what ``state`` has not seen, then record it; the save file is opened before posting."""
        return _deliver(self, state)


def _deliver(d: _Delivery, state: DedupState) -> int:
    platform, alert, url, redactor, log = d.platform, d.alert, d.url, d.redactor, d.log
    alert.items = state.pending(platform.name, alert.items)
    if not alert.items:
        log.write(f"opgate alert: {platform.name}: nothing new to send for run {alert.run_id}\n")
        return 0
    target, payload = platform.build(alert, url, d.secret or None, time.time())
    redactor.add_url(target)
    state.prepare()
    key = alert.idempotency_key if platform.idempotent else None
    # when it was sent, by the clock (never SOURCE_DATE_EPOCH, a build's fixed date): the state keeps
    # entries KEEP_DAYS from now, and one stamped with last spring's commit date would be dropped at
    # once, and the alert sent again by the next run
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    post_json(
        platform.name, target, payload, platform.check, redactor,
        policy=d.policy, sleep=d.sleep, log=log, idempotency_key=key,
    )  # fmt: skip
    state.mark(platform.name, alert.items, stamp)
    try:
        state.save()
    except OSError as exc:  # the post is out: say so, and that a re-run would repeat it
        log.write(
            f"opgate alert: {platform.name}: delivered, but the alert state {state.path} could not be "
            f"saved ({exc.strerror or exc}): a re-run would post it again\n"
        )
    note = "" if platform.confirms_delivery else "; accepted, the platform does not confirm the post"
    log.write(
        f"opgate alert: {platform.name}: sent {len(alert.items)} regression(s) to {redact_url(url)} "
        f"(run {alert.run_id}{note})\n"
    )
    return len(alert.items)
