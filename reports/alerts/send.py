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
from pathlib import Path
from typing import Any, TextIO

from opgate.matrix.errors import UsageError
from opgate.reports.alerts.dedup import DedupState
from opgate.reports.alerts.message import from_diff
from opgate.reports.alerts.registry import PLATFORMS
from opgate.reports.alerts.transport import Redactor, RetryPolicy, check_url, post_json, redact_url
from opgate.reports.compat import now_utc


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
    policy: RetryPolicy | None = None,
    log: TextIO | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Send what is new; return the number of regressions delivered (0: nothing to do)."""
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
    state = DedupState.load(state_path)
    alert.items = state.pending(platform.name, alert.items)
    if not alert.items:
        log.write(f"opgate alert: {platform.name}: nothing new to send for run {alert.run_id}\n")
        return 0
    target, payload = platform.build(alert, url, secret or None, time.time())
    redactor.add_url(target)
    post_json(platform.name, target, payload, platform.check, redactor, policy=policy, sleep=sleep, log=log)
    state.mark(platform.name, alert.items, now_utc())
    state.save()
    note = "" if platform.confirms_delivery else "; accepted, the platform does not confirm the post"
    log.write(
        f"opgate alert: {platform.name}: sent {len(alert.items)} regression(s) to {redact_url(url)} "
        f"(run {alert.run_id}{note})\n"
    )
    return len(alert.items)
