"""Feishu/Lark custom bot: an interactive card, signed with HMAC-SHA256.

Signature: ``base64(HMAC_SHA256(key=f"{timestamp}\\n{secret}", msg=b""))`` with
the timestamp in seconds (accepted within an hour).  The bot answers HTTP 200
for most errors: ``{"code": 19021, "msg": "sign match fail ..."}``, so the
body's ``code`` (``StatusCode`` on older deployments) must be 0.  Body <= 20 KB.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from typing import Any

from opgate.reports.alerts.message import Alert, fit, json_size
from opgate.reports.alerts.transport import Acceptance, Response

URL_ENV = "OPGATE_FEISHU_WEBHOOK_URL"
SECRET_ENV = "OPGATE_FEISHU_SECRET"  # noqa: S105 - a variable name, not a secret
MAX_BODY = 20 * 1024 - 512  # headroom under the 20 KB limit
RATE_LIMITED = {11232, 9499}


def sign(timestamp: str, secret: str) -> str:
    string_to_sign = f"{timestamp}\n{secret}".encode()
    digest = hmac.new(string_to_sign, b"", hashlib.sha256).digest()
    return base64.b64encode(digest).decode()


def payload(alert: Alert, k: int, timestamp: str, secret: str | None) -> dict[str, Any]:
    elements: list[dict[str, Any]] = [{"tag": "markdown", "content": "\n".join(alert.body(k))}]
    if alert.report_url:
        elements.append(
            {
                "tag": "action",
                "actions": [
                    {
                        "tag": "button",
                        "text": {"tag": "plain_text", "content": "Full report"},
                        "type": "primary",
                        "url": alert.report_url,
                    }
                ],
            }
        )
    body: dict[str, Any] = {
        "msg_type": "interactive",
        "card": {
            "config": {"wide_screen_mode": True},
            "header": {"title": {"tag": "plain_text", "content": alert.title}, "template": "red"},
            "elements": elements,
        },
    }
    if secret:
        body = {"timestamp": timestamp, "sign": sign(timestamp, secret), **body}
    return body


def build(alert: Alert, url: str, secret: str | None, now: float) -> tuple[str, dict[str, Any]]:
    timestamp = str(int(now))
    body = fit(
        lambda k: payload(alert, k, timestamp, secret), len(alert.items), lambda p: json_size(p) <= MAX_BODY
    )
    return url, body


def check(response: Response) -> Acceptance:
    body = response.json()
    if not isinstance(body, dict):
        return Acceptance(f"Feishu answered a non-JSON body {response.body[:100]!r}")
    code = body.get("code", body.get("StatusCode"))
    if code == 0:
        return Acceptance()
    message = body.get("msg", body.get("StatusMessage", ""))
    return Acceptance(f"Feishu code {code}: {message}", retryable=code in RATE_LIMITED)
