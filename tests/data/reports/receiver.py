"""A real HTTP server on loopback that plays a chat platform for the alert tests.

It records every request (path, query, headers, body) and answers from a
script of replies (status, body, headers, delay), so tests can inject 4xx,
5xx, 429 + Retry-After, "HTTP 200 with an error code" and timeouts.  It binds
127.0.0.1 on an ephemeral port and serves only while the test runs.
"""

from __future__ import annotations

import json
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
    delay: float = 0.0


@dataclass(frozen=True)
class Request:
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class Receiver:
    """Records requests; answers each from the script, then with ``default``."""

    def __init__(self, default: Reply) -> None:
        self.default = default
        self.script: deque[Reply] = deque()
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                parts = urllib.parse.urlsplit(self.path)
                with receiver._lock:
                    receiver.requests.append(
                        Request(
                            parts.path, dict(urllib.parse.parse_qsl(parts.query)), dict(self.headers), body
                        )
                    )
                    reply = receiver.script.popleft() if receiver.script else receiver.default
                if reply.delay:
                    time.sleep(reply.delay)
                try:
                    payload = reply.body.encode()
                    self.send_response(reply.status)
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout test)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def reply(self, *replies: Reply) -> None:
        self.script.extend(replies)


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
