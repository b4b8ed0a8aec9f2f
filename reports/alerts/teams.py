"""Microsoft Teams through a Workflows webhook ("When a Teams webhook request is received").

Office 365 connector webhooks are retired; Workflows take a message with an
Adaptive Card attachment (28 KB max).  Workflows answer 202 Accepted even when
posting to the channel fails later, so a 2xx here means "accepted", which is
the most any sender can know; the run log says so.
"""

from __future__ import annotations

from typing import Any

from opgate.reports.alerts.message import Alert, fit, json_size
from opgate.reports.alerts.transport import Acceptance, Response

URL_ENV = "OPGATE_TEAMS_WEBHOOK_URL"
SECRET_ENV = None
MAX_BODY = 28 * 1024 - 512
CONFIRMS_DELIVERY = False  # a 202 only means the flow accepted the request


def payload(alert: Alert, k: int) -> dict[str, Any]:
    card: dict[str, Any] = {
        "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
        "type": "AdaptiveCard",
        "version": "1.4",
        "body": [
            {"type": "TextBlock", "text": alert.title, "weight": "Bolder", "size": "Medium", "wrap": True},
            *({"type": "TextBlock", "text": line, "wrap": True, "spacing": "None"} for line in alert.body(k)),
        ],
    }
    if alert.report_url:
        card["actions"] = [{"type": "Action.OpenUrl", "title": "Full report", "url": alert.report_url}]
    return {
        "type": "message",
        "attachments": [
            {"contentType": "application/vnd.microsoft.card.adaptive", "contentUrl": None, "content": card}
        ],
    }


def build(alert: Alert, url: str, secret: str | None, now: float) -> tuple[str, dict[str, Any]]:
    return url, fit(lambda k: payload(alert, k), len(alert.items), lambda p: json_size(p) <= MAX_BODY)


def check(response: Response) -> Acceptance:
    return Acceptance()  # any 2xx: accepted (Teams reports later failures only in the flow's run history)
