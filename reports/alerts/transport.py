"""Delivering one alert: a deadline, retries only where a copy cannot be posted twice, no secret shown.

A webhook URL *is* a credential (Slack, WeCom, Discord and Teams put the token
in the URL), so nothing here ever formats a URL or an exception text that may
contain one: messages name the endpoint by scheme and host only, and every
server-supplied text passes through :class:`Redactor` first.

Delivery is "exactly once, or reported as not delivered": a chat post
cannot be taken back, and none of the chat platforms opgate speaks to takes
an idempotency key on its incoming webhooks, so a retry is made only where
the platform *cannot* have the message:

* the request never fully left (:class:`~reports.alerts.exchange.Phase`
  ``connect``/``send``: refused, DNS, TLS, reset while sending);
* the platform said it did not take it: HTTP 429 (rate limit; its
  ``Retry-After``, or Discord's JSON ``retry_after``, sets the wait), 503
  (unavailable), 408 (request timeout), or a platform error code meaning
  "rate limited" in an HTTP 200 body (Feishu, DingTalk, WeCom).

Everything after the request was sent without a clear answer (a timeout, a
reset, a 500/502/504) is final: the message may have been posted, and
posting it again could make two.  The generic ``webhook`` target is the
exception: its schema carries an ``Idempotency-Key`` (header and body), so a
receiver can drop a repeat and such failures are retried too.  Redirects are
refused (a POST is never re-sent as a GET, nor anywhere else).

``RetryPolicy.timeout`` is one wall-clock deadline for the whole delivery:
every attempt, and every wait between attempts, ends before it.
"""

from __future__ import annotations

import contextlib
import email.utils
import http.client
import json
import sys
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TextIO

from opgate.matrix.errors import AlertDeliveryFailed
from opgate.reports.alerts import exchange
from opgate.reports.alerts.exchange import Answer

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
    """``timeout``: one deadline (s) for the whole delivery, attempts and waits included."""

    timeout: float = 60.0
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
            with contextlib.suppress(TypeError, ValueError, IndexError, OverflowError):
                parsed = email.utils.parsedate_to_datetime(header)
                return max(0.0, parsed.timestamp() - (now if now is not None else time.time()))
    body = response.json()
    if isinstance(body, dict) and isinstance(body.get("retry_after"), (int, float)):
        return max(0.0, float(body["retry_after"]))
    return None


def check_url(url: str, env_name: str) -> None:
    """Refuse anything but http(s) with a host, naming the variable, never the value."""
    try:
        parts = urllib.parse.urlsplit(url)
        valid = parts.scheme in ("http", "https") and bool(parts.hostname)
        _ = parts.port  # a malformed port raises here, not mid-delivery
    except ValueError:
        valid = False
    if not valid:
        raise AlertDeliveryFailed(f"{env_name} is not an http(s) URL ({redact_url(url)})")


#: Statuses that say the request was not taken: retrying cannot post twice.
NOT_TAKEN = frozenset({408, 429, 503})


@dataclass(frozen=True)
class _Outcome:
    """One attempt, judged: delivered, or why not and whether another attempt is safe."""

    response: Response | None
    problem: str = ""
    safe_retry: bool = False  # another attempt cannot post a second copy
    wait: float | None = None  # the platform asked for this delay
    maybe_posted: bool = False  # no clear answer after the request was sent


def _judge(
    answer: Answer, check: Callable[[Response], Acceptance], redactor: Redactor, where: str, idempotent: bool
) -> _Outcome:
    response = Response(answer.status, answer.body, answer.headers)
    preview = redactor.scrub(response.body[:BODY_PREVIEW])
    status = response.status
    if 200 <= status < 300:
        accepted = check(response)
        if accepted.error is None:
            return _Outcome(response)
        return _Outcome(
            None, f"HTTP {status} with error: {redactor.scrub(accepted.error)}", accepted.retryable
        )
    if 300 <= status < 400:
        target = redact_url(response.headers.get("Location") or response.headers.get("location") or "")
        return _Outcome(
            None,
            f"HTTP {status} redirect to {target}: refused (a redirect would drop or re-send the POST; "
            f"set the webhook variable to the final URL instead of {where})",
        )
    if status in NOT_TAKEN:
        return _Outcome(None, f"HTTP {status}: {preview!r}", True, retry_after(response))
    if status >= 500:
        return _Outcome(None, f"HTTP {status}: {preview!r}", idempotent, retry_after(response), True)
    return _Outcome(None, f"HTTP {status}: {preview!r}")


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
    idempotency_key: str | None = None,
) -> Response:
    """POST ``payload``; return the accepted response or raise :class:`AlertDeliveryFailed`.

    With ``idempotency_key`` (sent as ``Idempotency-Key``) a receiver can drop
    repeats, so failures after the request was sent are retried as well.
    """
    policy = policy or RetryPolicy()
    log = log if log is not None else sys.stderr
    data = json.dumps(payload, ensure_ascii=False).encode()
    headers = {"Content-Type": "application/json; charset=utf-8", "User-Agent": USER_AGENT}
    if idempotency_key:
        headers["Idempotency-Key"] = idempotency_key
    where = redact_url(url)
    deadline = time.monotonic() + policy.timeout
    outcome = _Outcome(None, "not attempted")
    attempt = 0
    while attempt < policy.attempts:
        attempt += 1
        try:
            outcome = _judge(
                exchange.post(url, data, headers, deadline), check, redactor, where, bool(idempotency_key)
            )
        except exchange.ExchangeFailed as exc:
            arrived = exc.phase.may_have_arrived
            problem = f"{redactor.scrub(exc.problem)} ({exc.phase.value})"
            outcome = _Outcome(None, problem, not arrived or bool(idempotency_key), None, arrived)
        except (ValueError, http.client.InvalidURL):
            raise AlertDeliveryFailed(f"{platform}: malformed webhook URL ({where})") from None
        if outcome.response is not None:
            return outcome.response
        if not outcome.safe_retry or attempt == policy.attempts:
            break
        wanted = outcome.wait if outcome.wait is not None else policy.backoff * 2 ** (attempt - 1)
        delay = min(wanted, policy.max_wait)
        if time.monotonic() + delay >= deadline:
            problem = f"{outcome.problem}; no time left for a retry within --timeout"
            outcome = replace(outcome, problem=problem, safe_retry=False)
            break
        retry = f"retry {attempt}/{policy.attempts - 1} in {delay:.2f} s"
        log.write(f"opgate alert: {platform}: {outcome.problem} from {where}; {retry}\n")
        sleep(delay)
    unsure = "" if not outcome.maybe_posted else (_KEYED if idempotency_key else _MAYBE)
    raise AlertDeliveryFailed(
        f"{platform}: delivery to {where} failed after {attempt} attempt(s): {outcome.problem}{unsure}"
    )


_MAYBE = "; the platform may have received it, so it was not sent again (check the channel)"
_KEYED = "; the receiver may hold a copy: every attempt carried the same Idempotency-Key"
