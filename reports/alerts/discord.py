"""Discord webhook: content + one embed, mentions disabled.

``?wait=true`` makes Discord answer 200 with the created message instead of a
bare 204, so a delivery is confirmed.  Limits: content 2000 characters, embed
title 256, description 4096, all embed text 6000.  429 answers carry JSON
``retry_after`` (seconds), honoured by the transport.  ``allowed_mentions``
is empty so a cell id or reason can never ping ``@everyone``.
"""

from __future__ import annotations

import urllib.parse
from typing import Any

from opgate.reports.alerts.message import Alert, fit
from opgate.reports.alerts.transport import Acceptance, Response

URL_ENV = "OPGATE_DISCORD_WEBHOOK_URL"
SECRET_ENV = None
CONTENT_MAX = 2000
TITLE_MAX = 256
DESCRIPTION_MAX = 4096
EMBED_TOTAL_MAX = 6000


def with_wait(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qsl(parts.query)
    if not any(k == "wait" for k, _ in query):
        query.append(("wait", "true"))
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))


def payload(alert: Alert, k: int) -> dict[str, Any]:
    embed: dict[str, Any] = {
        "title": alert.title[:TITLE_MAX],
        "description": "\n".join(alert.body(k)),
        "color": 0xD73A49,
    }
    if alert.report_url:
        embed["url"] = alert.report_url
    return {
        "username": "opgate",
        "content": alert.title[:CONTENT_MAX],
        "embeds": [embed],
        "allowed_mentions": {"parse": []},
    }


def _ok(body: dict[str, Any]) -> bool:
    embed = body["embeds"][0]
    total = len(embed["title"]) + len(embed["description"])
    return len(embed["description"]) <= DESCRIPTION_MAX and total <= EMBED_TOTAL_MAX


def build(alert: Alert, url: str, secret: str | None, now: float) -> tuple[str, dict[str, Any]]:
    return with_wait(url), fit(lambda k: payload(alert, k), len(alert.items), _ok)


def check(response: Response) -> Acceptance:
    return Acceptance()  # 200 (wait=true) or 204: delivered; errors arrive as 4xx/5xx
