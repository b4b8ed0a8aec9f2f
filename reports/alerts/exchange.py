"""One HTTP POST within a wall-clock deadline, knowing how far it got when it failed.

Why not ``urllib.request``: it follows a 301/302/303 by re-sending the POST
as a GET without its body (a chat alert "delivered" to a redirect target
that never saw it), and its timeout bounds each socket operation, not the
exchange, so a receiver trickling one byte every two seconds holds an
attempt for as long as it likes.  Here:

* redirects are never followed: a 3xx is returned as the answer it is;
* the whole exchange (DNS, connect, TLS, send, status, headers, body) runs
  in a helper thread the caller waits for until ``deadline``; past it the
  socket is shut down and the attempt ends, whatever the peer is doing;
* a failure says which :class:`Phase` it happened in, because only the
  phases before the request was fully sent are ones where the platform
  cannot have received the message (and a retry cannot post it twice).

Proxies: ``HTTPS_PROXY``/``HTTP_PROXY``/``NO_PROXY`` are honoured as urllib
would (CONNECT tunnel for https).
"""

from __future__ import annotations

import contextlib
import enum
import http.client
import socket
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass

#: The most of a response body kept (error texts, Discord's message echo); the rest is not read.
MAX_BODY = 64 * 1024


class Phase(enum.Enum):
    """How far an attempt got; ``sent`` is the first phase where the platform may have the message."""

    CONNECT = "connect"  # DNS, TCP, proxy tunnel, TLS: nothing of the request has left
    SEND = "send"  # the request is being written: the receiver cannot have all of it
    SENT = "sent"  # the whole request is out; waiting for or reading the answer

    @property
    def may_have_arrived(self) -> bool:
        return self is Phase.SENT


@dataclass
class Answer:
    status: int
    body: str
    headers: dict[str, str]


class ExchangeFailed(Exception):
    """No complete answer: ``phase`` says whether the receiver may have the request."""

    def __init__(self, phase: Phase, problem: str) -> None:
        super().__init__(problem)
        self.phase = phase
        self.problem = problem


def _proxy_for(parts: urllib.parse.SplitResult) -> urllib.parse.SplitResult | None:
    proxy = urllib.request.getproxies().get(parts.scheme)
    if not proxy or urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    return urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")


def _connection(url: str, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    """A connection to ``url``'s host (or its proxy) and the request target to send."""
    parts = urllib.parse.urlsplit(url)
    target = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
    host, port = parts.hostname or "", parts.port
    proxy = _proxy_for(parts)
    secure = parts.scheme == "https"
    if proxy is None:
        cls = http.client.HTTPSConnection if secure else http.client.HTTPConnection
        return cls(host, port, timeout=timeout), target
    if secure:
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            proxy.hostname or "", proxy.port, timeout=timeout
        )
        conn.set_tunnel(host, port)
        return conn, target
    return http.client.HTTPConnection(proxy.hostname or "", proxy.port, timeout=timeout), url


def _describe(exc: BaseException) -> str:
    if isinstance(exc, socket.gaierror):
        return f"name resolution failed ({exc.strerror or exc})"
    text = getattr(exc, "strerror", None) or str(exc) or "no detail"
    return f"{type(exc).__name__}: {text}"


def post(url: str, body: bytes, headers: Mapping[str, str], deadline: float) -> Answer:
    """POST ``body`` to ``url``; the answer (any status, 3xx included) or :class:`ExchangeFailed`.

    ``deadline`` is a :func:`time.monotonic` instant; nothing here outlives it
    by more than the moment it takes to shut a socket.
    """
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise ExchangeFailed(Phase.CONNECT, "no time left before the deadline")
    conn, target = _connection(url, remaining)
    state: dict[str, object] = {"phase": Phase.CONNECT}
    # the caller giving up and the thread starting to send are decided under one lock: a post the
    # caller reported as not sent (phase CONNECT) is never sent after all (a slow name lookup, which
    # no socket shutdown can interrupt, ends after the deadline and then finds it cancelled)
    decide = threading.Lock()

    def exchange() -> None:
        try:
            conn.connect()
            with decide:
                if state.get("cancelled"):
                    conn.close()
                    return
                state["phase"] = Phase.SEND
            conn.request("POST", target, body=body, headers=dict(headers))
            state["phase"] = Phase.SENT
            response = conn.getresponse()
            text = response.read(MAX_BODY).decode("utf-8", "replace")
            state["answer"] = Answer(response.status, text, dict(response.headers))
        except BaseException as exc:  # noqa: BLE001 - reported to the waiting caller, phase attached
            state["error"] = exc

    worker = threading.Thread(target=exchange, name="opgate-alert-post", daemon=True)
    worker.start()
    worker.join(max(0.0, deadline - time.monotonic()))
    with decide:
        timed_out = worker.is_alive()
        if timed_out:
            state["cancelled"] = True  # still connecting: it stays so, and sends nothing
    if timed_out:
        _abort(conn)
        worker.join(1.0)
    conn.close()
    answer, error, phase = state.get("answer"), state.get("error"), state["phase"]
    assert isinstance(phase, Phase)
    if isinstance(answer, Answer) and not timed_out:
        return answer
    if timed_out or isinstance(error, TimeoutError):  # the socket's own timeout is the same deadline
        waited = {Phase.CONNECT: "to connect", Phase.SEND: "to send the request"}.get(phase, "for the answer")
        raise ExchangeFailed(phase, f"deadline reached while waiting {waited}")
    assert isinstance(error, BaseException)
    raise ExchangeFailed(phase, _describe(error))


def _abort(conn: http.client.HTTPConnection) -> None:
    """Unblock the helper thread: shut the socket down under it, then close it."""
    sock = conn.sock
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        conn.close()
