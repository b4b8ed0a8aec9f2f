"""HTTP delivery with urllib: timeouts, bounded retries, and no secret in any message.

A webhook URL *is* a credential (Slack, WeCom, Discord and Teams put the token
in the URL), so nothing here ever formats a URL or an exception text that may
contain one: messages name the endpoint by scheme and host only, and every
server-supplied text passes through :class:`Redactor` first.

Retry policy: 5xx, 429, timeouts and connection errors are retried with
exponential backoff; a ``Retry-After`` header (or Discord's JSON
``retry_after``) replaces the backoff but is capped at ``max_wait`` so a
misbehaving server cannot park a CI job.  Other 4xx answers are final.  A 2xx
whose body carries a platform error code is judged by the platform's checker.
"""

from __future__ import annotations

import email.utils
import http.client
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

from opgate.matrix.errors import AlertDeliveryFailed

USER_AGENT = "opgate-alerts/1"
BODY_PREVIEW = 200


def redact_url(url: str) -> str:
    """``scheme://host[:port]``: the only part of a webhook URL that may be printed."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<malformed URL>"
    return f"{parts.scheme or '?'}://{host}{port}"


@dataclass
class Redactor:
    """Replaces every secret (and the secret-bearing parts of URLs) with ``***``."""

    secrets: list[str] = field(default_factory=list)

    def add(self, value: str | None) -> None:
        if value and len(value) >= 4 and value not in self.secrets:
            self.secrets.append(value)

    def add_url(self, url: str) -> None:
        """The URL, its path and query, and each path segment or query value long enough to be a token."""
        self.add(url)
        try:
            parts = urllib.parse.urlsplit(url)
        except ValueError:
            return
        self.add(parts.path if parts.path not in ("", "/") else None)
        self.add(parts.query)
        for segment in parts.path.split("/"):
            if len(segment) >= 8:
                self.add(segment)
        for _, value in urllib.parse.parse_qsl(parts.query):
            if len(value) >= 6:
                self.add(value)
                self.add(urllib.parse.quote(value, safe=""))

    def scrub(self, text: str) -> str:
        for secret in sorted(self.secrets, key=len, reverse=True):
            text = text.replace(secret, "***")
        return text


@dataclass
class Response:
    status: int
    body: str
    headers: Mapping[str, str]

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            return None


@dataclass(frozen=True)
class Acceptance:
    """Whether the platform accepted a message, read from its response: ``error`` None means delivered.

    Not a cell verdict (:class:`opgate.validators.result.Verdict`): an alert never changes one.
    """

    error: str | None = None
    retryable: bool = False


@dataclass
class RetryPolicy:
    timeout: float = 10.0
    attempts: int = 4
    backoff: float = 1.0
    max_wait: float = 30.0


def retry_after(response: Response, now: float | None = None) -> float | None:
    """Seconds to wait from ``Retry-After`` (seconds or HTTP date) or a JSON ``retry_after``."""
    header = next((v for k, v in response.headers.items() if k.lower() == "retry-after"), None)
    if header:
        try:
            return max(0.0, float(header))
        except ValueError:
            parsed = email.utils.parsedate_to_datetime(header) if header else None
            if parsed is not None:
                return max(0.0, parsed.timestamp() - (now if now is not None else time.time()))
    body = response.json()
    if isinstance(body, dict) and isinstance(body.get("retry_after"), (int, float)):
        return max(0.0, float(body["retry_after"]))
    return None


def _send(url: str, data: bytes, timeout: float) -> Response:
    request = urllib.request.Request(  # noqa: S310 - scheme checked by check_url
        url,
        data=data,
        method="POST",
        headers={"Content-Type": "application/json; charset=utf-8", "User-Agent": USER_AGENT},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:  # noqa: S310
            return Response(answer.status, answer.read().decode("utf-8", "replace"), dict(answer.headers))
    except urllib.error.HTTPError as exc:
        body = exc.read().decode("utf-8", "replace") if exc.fp is not None else ""
        return Response(exc.code, body, dict(exc.headers or {}))


def check_url(url: str, env_name: str) -> None:
    """Refuse anything but http(s) with a host, naming the variable, never the value."""
    try:
        parts = urllib.parse.urlsplit(url)
        valid = parts.scheme in ("http", "https") and bool(parts.hostname)
    except ValueError:
        valid = False
    if not valid:
        raise AlertDeliveryFailed(f"{env_name} is not an http(s) URL ({redact_url(url)})")


def post_json(
    platform: str,
    url: str,
    payload: Any,
    check: Callable[[Response], Acceptance],
    redactor: Redactor,
    *,
    policy: RetryPolicy | None = None,
    sleep: Callable[[float], None] = time.sleep,
    log: TextIO | None = None,
) -> Response:
    """POST ``payload``; return the accepted response or raise :class:`AlertDeliveryFailed`."""
    policy = policy or RetryPolicy()
    log = log if log is not None else sys.stderr
    data = json.dumps(payload, ensure_ascii=False).encode()
    where = redact_url(url)
    problem = "not attempted"
    for attempt in range(1, policy.attempts + 1):
        wait: float | None = None
        try:
            response = _send(url, data, policy.timeout)
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            reason = getattr(exc, "reason", None) or exc
            problem = f"{type(exc).__name__}: {redactor.scrub(str(reason))}"
            retryable = True
        except ValueError:
            raise AlertDeliveryFailed(f"{platform}: malformed webhook URL ({where})") from None
        else:
            preview = redactor.scrub(response.body[:BODY_PREVIEW])
            if 200 <= response.status < 300:
                verdict = check(response)
                if verdict.error is None:
                    return response
                problem = f"HTTP {response.status} with error: {redactor.scrub(verdict.error)}"
                retryable = verdict.retryable
            else:
                problem = f"HTTP {response.status}: {preview!r}"
                retryable = response.status == 429 or response.status >= 500
                wait = retry_after(response) if retryable else None
        if not retryable or attempt == policy.attempts:
            break
        delay = min(wait if wait is not None else policy.backoff * 2 ** (attempt - 1), policy.max_wait)
        log.write(
            f"opgate alert: {platform}: {problem} from {where}; retry {attempt}/{policy.attempts - 1} "
            f"in {delay:.2f} s\n"
        )
        sleep(delay)
    raise AlertDeliveryFailed(f"{platform}: delivery to {where} failed after {attempt} attempt(s): {problem}")
