"""Slack incoming webhook: Block Kit, no signing (the URL is the secret).

Limits: 50 blocks, 3000 characters per section text, 150 per header; Slack
truncates beyond 40k characters, far past readability, so the body is capped
at 12k characters of text.  Success is the literal body ``ok``; errors are
plain-text bodies (``invalid_payload``, ``no_service``, ...).
"""

from __future__ import annotations

from typing import Any

from opgate.reports.alerts.message import Alert, fit
from opgate.reports.alerts.transport import Acceptance, Response

URL_ENV = "OPGATE_SLACK_WEBHOOK_URL"
SECRET_ENV = None
MAX_BLOCKS = 50
SECTION_MAX = 3000
HEADER_MAX = 150
TEXT_BUDGET = 12000


def escape(text: str) -> str:
    """mrkdwn control characters (a ``<`` would start a link)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _sections(lines: list[str]) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    chunk = ""
    for line in (escape(x)[: SECTION_MAX - 1] for x in lines):
        if chunk and len(chunk) + 1 + len(line) > SECTION_MAX:
            blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": chunk}})
            chunk = ""
        chunk = f"{chunk}\n{line}" if chunk else line
    if chunk:
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": chunk}})
    return blocks


def payload(alert: Alert, k: int) -> dict[str, Any]:
    context = f"run {escape(alert.run_id)}"
    if alert.report_url:
        context = f"<{alert.report_url}|Full report> · {context}"
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": alert.title[:HEADER_MAX]}},
        *_sections(alert.body(k)),
        {"type": "context", "elements": [{"type": "mrkdwn", "text": context}]},
    ]
    return {"text": alert.title, "blocks": blocks}


def _ok(body: dict[str, Any]) -> bool:
    blocks = body["blocks"]
    text = sum(len(b["text"]["text"]) for b in blocks if b["type"] == "section")
    return len(blocks) <= MAX_BLOCKS and text <= TEXT_BUDGET


def build(alert: Alert, url: str, secret: str | None, now: float) -> tuple[str, dict[str, Any]]:
    return url, fit(lambda k: payload(alert, k), len(alert.items), _ok)


def check(response: Response) -> Acceptance:
    body = response.body.strip()
    return Acceptance() if body == "ok" else Acceptance(f"Slack answered {body[:100]!r} instead of 'ok'")
