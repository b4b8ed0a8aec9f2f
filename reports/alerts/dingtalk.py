"""DingTalk robot: markdown message, signed URL.

Signature: ``urlencode(base64(HMAC_SHA256(key=secret, msg=f"{timestamp_ms}\\n{secret}")))``
appended as ``&timestamp=...&sign=...``.  Errors come back as HTTP 200 with
``{"errcode": 310000, "errmsg": "sign not match"}`` and friends; only
``errcode == 0`` is a delivery.  The markdown text is kept under 4000 bytes (a
conservative bound: robots throttle long messages and clients fold them).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import urllib.parse
from typing import Any

from opgate.reports.alerts.message import Alert, fit
from opgate.reports.alerts.transport import Acceptance, Response

URL_ENV = "OPGATE_DINGTALK_WEBHOOK_URL"
SECRET_ENV = "OPGATE_DINGTALK_SECRET"  # noqa: S105 - a variable name, not a secret
MAX_TEXT = 4000
RATE_LIMITED = {130101, 410100}


def sign(timestamp_ms: str, secret: str) -> str:
    string_to_sign = f"{timestamp_ms}\n{secret}".encode()
    digest = hmac.new(secret.encode(), string_to_sign, hashlib.sha256).digest()
    return urllib.parse.quote_plus(base64.b64encode(digest).decode())


def signed_url(url: str, secret: str | None, now: float) -> str:
    if not secret:
        return url
    timestamp = str(round(now * 1000))
    joiner = "&" if urllib.parse.urlsplit(url).query else "?"
    return f"{url}{joiner}timestamp={timestamp}&sign={sign(timestamp, secret)}"


def payload(alert: Alert, k: int) -> dict[str, Any]:
    lines = [f"### {alert.title}", "", *(f"- {line}" for line in alert.body(k))]
    if alert.report_url:
        lines += ["", f"[Full report]({alert.report_url})"]
    return {"msgtype": "markdown", "markdown": {"title": alert.title, "text": "\n".join(lines)}}


def build(alert: Alert, url: str, secret: str | None, now: float) -> tuple[str, dict[str, Any]]:
    body = fit(
        lambda k: payload(alert, k),
        len(alert.items),
        lambda p: len(p["markdown"]["text"].encode()) <= MAX_TEXT,
    )
    return signed_url(url, secret, now), body


def check(response: Response) -> Acceptance:
    body = response.json()
    if not isinstance(body, dict):
        return Acceptance(f"DingTalk answered a non-JSON body {response.body[:100]!r}")
    code = body.get("errcode")
    if code == 0:
        return Acceptance()
    return Acceptance(f"DingTalk errcode {code}: {body.get('errmsg', '')}", retryable=code in RATE_LIMITED)
