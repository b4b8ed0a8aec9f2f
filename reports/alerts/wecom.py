"""WeCom (WeChat Work) group bot: markdown, no signing (the ``key`` is the secret).

Markdown content is limited to 4096 bytes (UTF-8).  Errors are HTTP 200 with
``errcode`` != 0 (93000: invalid webhook; 45009: rate limit).
"""

from __future__ import annotations

from typing import Any

from opgate.reports.alerts.message import Alert, fit
from opgate.reports.alerts.transport import Acceptance, Response

URL_ENV = "OPGATE_WECOM_WEBHOOK_URL"
SECRET_ENV = None
MAX_CONTENT = 4096
RATE_LIMITED = {45009}


def payload(alert: Alert, k: int) -> dict[str, Any]:
    lines = [f"**{alert.title}**", *alert.body(k)]
    if alert.report_url:
        lines.append(f"[Full report]({alert.report_url})")
    return {"msgtype": "markdown", "markdown": {"content": "\n".join(lines)}}


def build(alert: Alert, url: str, secret: str | None, now: float) -> tuple[str, dict[str, Any]]:
    body = fit(
        lambda k: payload(alert, k),
        len(alert.items),
        lambda p: len(p["markdown"]["content"].encode()) <= MAX_CONTENT,
    )
    return url, body


def check(response: Response) -> Acceptance:
    body = response.json()
    if not isinstance(body, dict):
        return Acceptance(f"WeCom answered a non-JSON body {response.body[:100]!r}")
    code = body.get("errcode")
    if code == 0:
        return Acceptance()
    return Acceptance(f"WeCom errcode {code}: {body.get('errmsg', '')}", retryable=code in RATE_LIMITED)
