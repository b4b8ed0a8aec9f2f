"""A real HTTP server on loopback that plays a chat platform for the alert tests.

It records every request (method, path, query, headers, body) and answers
from a script of replies (status, body, headers, delay, trickle), so tests can
inject 3xx redirects, 4xx, 5xx, 429 + Retry-After, "HTTP 200 with an error
code", a receiver that never answers and one that answers a byte at a time.
``answered`` holds the requests whose whole answer reached a client that was
still listening: what "the platform accepted it" means for a 2xx.  It binds
127.0.0.1 on an ephemeral port and serves only while the test runs.
"""

from __future__ import annotations

import dataclasses
import json
import select
import socket
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Reply:
    status: int = 200
    body: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0  # seconds before answering (longer than the client's deadline: a hang)
    trickle: float = 0.0  # seconds between single bytes of the answer


@dataclass(frozen=True)
class Request:
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes
    method: str = "POST"
    status: int = 0  # what the receiver answered (set in ``answered``)

    def json(self) -> Any:
        return json.loads(self.body)


class Receiver:
    """Records requests; answers each from the script, then with ``default``."""

    def __init__(self, default: Reply) -> None:
        self.default = default
        self.script: deque[Reply] = deque()
        self.requests: list[Request] = []
        self.answered: list[Request] = []
        self._lock = threading.Lock()
        self._busy = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                self._serve(self.rfile.read(length))

            def do_GET(self) -> None:  # what a client following a redirect as a GET would send
                self._serve(b"")

            def _serve(self, body: bytes) -> None:
                with receiver._lock:
                    receiver._busy += 1
                try:
                    self._answer(body)
                finally:
                    with receiver._lock:
                        receiver._busy -= 1

            def _answer(self, body: bytes) -> None:
                parts = urllib.parse.urlsplit(self.path)
                query = dict(urllib.parse.parse_qsl(parts.query))
                request = Request(parts.path, query, dict(self.headers), body, self.command)
                with receiver._lock:
                    receiver.requests.append(request)
                    reply = receiver.script.popleft() if receiver.script else receiver.default
                until = time.monotonic() + reply.delay
                while time.monotonic() < until:  # a hang, left as soon as the client gives up
                    if _peer_closed(self.connection):
                        return
                    time.sleep(0.02)
                try:
                    if _peer_closed(self.connection):
                        return
                    head = [f"HTTP/1.1 {reply.status} Reply"]
                    head += [f"{name}: {value}" for name, value in reply.headers.items()]
                    payload = reply.body.encode()
                    head += [f"Content-Length: {len(payload)}", "Connection: close", "", ""]
                    answer = "\r\n".join(head).encode() + payload
                    if reply.trickle:
                        for i in range(len(answer)):
                            time.sleep(reply.trickle)
                            if _peer_closed(self.connection):
                                return  # gave up mid-answer
                            self.wfile.write(answer[i : i + 1])
                    else:
                        self.wfile.write(answer)
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    return  # the client gave up (deadline)
                with receiver._lock:
                    receiver.answered.append(dataclasses.replace(request, status=reply.status))
                self.close_connection = True

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def reply(self, *replies: Reply) -> None:
        self.script.extend(replies)

    def posts(self) -> list[Request]:
        return [r for r in self.requests if r.method == "POST"]

    def settle(self, timeout: float = 5.0) -> None:
        """Wait until no request is being answered (a client may read an answer before it is recorded)."""
        deadline = time.monotonic() + timeout
        while self._busy and time.monotonic() < deadline:
            time.sleep(0.01)

    def delivered(self, by_key: str | None = None) -> int:
        """Messages accepted: complete 2xx answers, repeats of one ``by_key`` header counted once."""
        self.settle()
        ok = [r for r in self.answered if 200 <= r.status < 300]
        if by_key is None:
            return len(ok)
        return len({r.headers.get(by_key) for r in ok})


def _peer_closed(sock: socket.socket) -> bool:
    """Has the client closed its end (readable, and a peek reads nothing)?"""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


@contextmanager
def serve(default: Reply) -> Iterator[Receiver]:
    receiver = Receiver(default)
    thread = threading.Thread(
        target=receiver.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    try:
        yield receiver
    finally:
        receiver.server.shutdown()
        receiver.server.server_close()
        thread.join(timeout=5)
