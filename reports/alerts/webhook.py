"""Generic JSON webhook: the alert as structured data, for any receiver.

Schema ``urn:opgate:schema:alert:1``; every item carries its dedup key parts
(kind, cell, device) so a receiver can route or deduplicate on its own.  Body
capped at 256 KiB; any 2xx is a delivery.

Idempotent: ``idempotency_key`` (also the ``Idempotency-Key`` header) is the
same for every attempt and every re-run of one alert, and a receiver must
treat a second request with a key it has seen as the first.  That is what
lets this target (and only this one) be retried after a timeout or a 5xx.
"""

from __future__ import annotations

from typing import Any

from opgate.reports.alerts.message import Alert, fit, json_size
from opgate.reports.alerts.transport import Acceptance, Response

URL_ENV = "OPGATE_WEBHOOK_URL"
SECRET_ENV = None
IDEMPOTENT = True
MAX_BODY = 256 * 1024
SCHEMA = "urn:opgate:schema:alert:1"


def payload(alert: Alert, k: int) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "source": "opgate",
        "title": alert.title,
        "run_id": alert.run_id,
        "idempotency_key": alert.idempotency_key,
        "report_url": alert.report_url,
        "head": alert.head,
        "summary": alert.summary,
        "items": [item.to_json() for item in alert.items[:k]],
        "omitted": len(alert.items) - min(k, len(alert.items)),
    }


def build(alert: Alert, url: str, secret: str | None, now: float) -> tuple[str, dict[str, Any]]:
    return url, fit(lambda k: payload(alert, k), len(alert.items), lambda p: json_size(p) <= MAX_BODY)


def check(response: Response) -> Acceptance:
    return Acceptance()
