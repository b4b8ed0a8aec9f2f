"""index.html in a real headless Chromium, driven over the DevTools protocol.

No browser-automation dependency: Chromium's own ``--remote-debugging-port``
and a small stdlib WebSocket client (below) are enough, and they cannot drift
out of step with the browser the way a separately versioned driver can.
Chromium is a hard requirement: without it the test FAILS with the install
command (CI installs it), because a skipped browser test proves nothing.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import struct
import subprocess
import time
import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from opgate.reports.publish import publish
from tests.data.reports.fixtures import ERROR_CELL, FAIL_CELL, HOSTILE_REASON, cpu_run, gpu_run, write_run

pytestmark = pytest.mark.browser

INSTALL_HINT = "headless Chromium is required: apt-get update && apt-get install -y chromium chromium-driver"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
    "--window-size=1400,1000",
)


def chromium_binary() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    pytest.fail(INSTALL_HINT)


class WebSocket:
    """Just enough RFC 6455 for the DevTools protocol: masked text frames out, text frames in."""

    def __init__(self, url: str, timeout: float = 30.0) -> None:
        assert url.startswith("ws://")
        host_port, _, path = url[len("ws://") :].partition("/")
        host, _, port = host_port.partition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            (
                f"GET /{path} HTTP/1.1\r\nHost: {host_port}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            assert chunk, "DevTools closed the connection during the handshake"
            head += chunk
        status = head.split(b"\r\n", 1)[0]
        assert b" 101 " in status, f"WebSocket handshake refused: {status!r}"
        self.buffer = head.split(b"\r\n\r\n", 1)[1]

    def _read(self, n: int) -> bytes:
        while len(self.buffer) < n:
            chunk = self.sock.recv(65536)
            assert chunk, "DevTools connection closed"
            self.buffer += chunk
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    def send(self, text: str, opcode: int = 0x1) -> None:
        payload = text.encode()
        header = bytes([0x80 | opcode])
        n = len(payload)
        if n < 126:
            header += bytes([0x80 | n])
        elif n < 1 << 16:
            header += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            header += bytes([0x80 | 127]) + struct.pack(">Q", n)
        mask = os.urandom(4)
        self.sock.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def recv(self) -> str:
        message = b""
        while True:
            b0, b1 = self._read(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._read(8))[0]
            mask = self._read(4) if b1 & 0x80 else b""
            payload = self._read(n)
            if mask:
                payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
            opcode = b0 & 0x0F
            if opcode == 0x9:  # ping
                self.send(payload.decode(), opcode=0xA)
                continue
            if opcode == 0x8:
                raise ConnectionError("DevTools closed the WebSocket")
            message += payload
            if b0 & 0x80:
                return message.decode()


class Page:
    """A DevTools session on one page, recording console errors, exceptions and requests."""

    def __init__(self, ws: WebSocket) -> None:
        self.ws = ws
        self.next_id = 0
        self.events: list[dict[str, Any]] = []
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable")

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == self.next_id:
                assert "error" not in message, f"{method}: {message['error']}"
                result: dict[str, Any] = message.get("result", {})
                return result
            self.events.append(message)

    def wait_event(self, method: str, timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        seen = len(self.events)
        while time.monotonic() < deadline:
            for event in self.events[seen:]:
                if event.get("method") == method:
                    return event
            seen = len(self.events)
            self.events.append(json.loads(self.ws.recv()))
        raise TimeoutError(method)

    def eval(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    def open(self, url: str) -> None:
        self.call("Page.navigate", url=url)
        self.wait_event("Page.loadEventFired")

    def click(self, selector: str) -> None:
        """A real mouse click at the element's centre (not element.click())."""
        rect = self.eval(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            " e.scrollIntoView({block: 'center', inline: 'center'}); const r = e.getBoundingClientRect();"
            " return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        for kind in ("mousePressed", "mouseReleased"):
            self.call(
                "Input.dispatchMouseEvent", type=kind, x=rect[0], y=rect[1], button="left", clickCount=1
            )

    def errors(self) -> list[str]:
        found = []
        for event in self.events:
            params = event.get("params", {})
            if event.get("method") == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                description = details.get("exception", {}).get("description", "")
                found.append(f"{details.get('text', '')} {description}".strip())
            elif event.get("method") == "Runtime.consoleAPICalled" and params.get("type") in (
                "error",
                "assert",
            ):
                found.append(json.dumps(params.get("args"))[:500])
            elif event.get("method") == "Log.entryAdded" and params["entry"]["level"] == "error":
                found.append(params["entry"]["text"])
        return found

    def requested_urls(self) -> list[str]:
        return [
            e["params"]["request"]["url"]
            for e in self.events
            if e.get("method") == "Network.requestWillBeSent"
        ]


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Page]:
    binary = chromium_binary()
    profile = tmp_path_factory.mktemp("chromium-profile")
    proc = subprocess.Popen(
        [binary, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            assert proc.poll() is None, f"chromium exited with {proc.returncode}; {INSTALL_HINT}"
            assert time.monotonic() < deadline, "chromium did not open its DevTools port within 60 s"
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as answer:
            targets = json.loads(answer.read())
        page = next(t for t in targets if t["type"] == "page")
        yield Page(WebSocket(page["webSocketDebuggerUrl"]))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("published")
    base = publish([write_run(cpu_run(), root / "cpu"), write_run(gpu_run(), root / "gpu")], root / "base")
    assert base.entries
    head_in = [write_run(cpu_run(), root / "cpu2"), write_run(gpu_run(slowdown=1.1, seed=3), root / "gpu2")]
    publish(head_in, root / "out", history=root / "base" / "compat.json")
    return root / "out"


def expected_slots(compat: dict[str, Any], **filters: str) -> int:
    """Visible slots computed from compat.json, independently of the page's script."""
    slots: set[tuple[str, ...]] = set()
    for cell in compat["cells"]:
        axes = cell["axes"]
        values = {**axes, "verdict": cell["verdict"], "row": f"{axes['op']}/{axes['impl']}"}
        if all(values[k] == v for k, v in filters.items()):
            column = (axes["torch"], axes["cuda"], axes["arch"])
            slots.add(
                (
                    axes["op"],
                    axes["impl"],
                    axes["dtype"],
                    axes["layout"],
                    axes["shapes"],
                    *column,
                    axes["mode"],
                )
            )
    return len(slots)


def set_filter(page: Page, name: str, value: str) -> int:
    page.eval(
        f"(() => {{ const s = document.getElementById('f-{name}'); s.value = {json.dumps(value)};"
        " s.dispatchEvent(new Event('change')); })()"
    )
    return int(page.eval("document.querySelectorAll('#matrix .slot').length"))


def test_dashboard_loads_filters_and_opens_a_failing_cell(browser: Page, report: Path) -> None:
    compat = json.loads((report / "compat.json").read_text())
    browser.open((report / "index.html").as_uri())

    assert browser.errors() == []
    assert browser.eval("document.title").startswith("opgate compatibility matrix")
    total = int(browser.eval("document.querySelectorAll('#matrix .slot').length"))
    assert total == expected_slots(compat) > 20

    # Filters change what is visible, to exactly the matching cells.
    assert set_filter(browser, "verdict", "fail") == expected_slots(compat, verdict="fail") == 1
    assert browser.eval("[...document.querySelectorAll('#matrix .slot')].map(b => b.dataset.cell)") == [
        FAIL_CELL
    ]
    assert set_filter(browser, "verdict", "") == total
    assert (
        set_filter(browser, "op", "silu_mul/triton") == expected_slots(compat, row="silu_mul/triton") < total
    )
    assert set_filter(browser, "mode", "compile") == expected_slots(
        compat, row="silu_mul/triton", mode="compile"
    )
    assert browser.eval(f"!!document.querySelector('.slot[data-cell=\"{ERROR_CELL}\"]')")
    browser.eval("document.getElementById('f-reset').click()")
    assert int(browser.eval("document.querySelectorAll('#matrix .slot').length")) == total

    # Clicking the failing cell opens its evidence; the hostile reason is shown as text, never run.
    assert browser.eval("document.getElementById('details').hidden") is True
    browser.click(f'.slot[data-cell="{FAIL_CELL}"]')
    assert browser.eval("document.getElementById('details').hidden") is False
    assert browser.eval("document.getElementById('details-id').textContent") == FAIL_CELL
    details = browser.eval("document.getElementById('details').innerText")
    assert "correctness" in details
    assert "opgate run --select" in details
    assert "max_abs_err" in details
    assert HOSTILE_REASON.split(" </script>")[0] in details
    assert "</script><script>window.__pwned=1</script>" in details
    assert browser.eval("typeof window.__pwned") == "undefined"

    # Perf charts are inline SVG, with a history line for the re-measured series.
    assert int(browser.eval("document.querySelectorAll('#perf svg.chart').length")) >= 2
    assert int(browser.eval("document.querySelectorAll('#perf svg.history polyline').length")) >= 1

    assert browser.errors() == []
    assert [u for u in browser.requested_urls() if not u.startswith(("file:", "data:"))] == []


PUBLISHED = Path(__file__).resolve().parents[1] / "reports" / "published"


def test_the_committed_published_page_loads_with_its_gpu_column_charts_and_block(browser: Page) -> None:
    """reports/published/index.html as committed: H200 and CPU environments, perf history, the block."""
    compat = json.loads((PUBLISHED / "compat.json").read_text())
    before = len(browser.errors())
    browser.open((PUBLISHED / "index.html").as_uri())
    assert browser.errors()[before:] == []
    assert int(browser.eval("document.querySelectorAll('#matrix .slot').length")) == expected_slots(compat)
    assert "sm_90 (H200)" in browser.eval("document.getElementById('summary').innerText")
    assert int(browser.eval("document.querySelectorAll('#perf svg.history polyline').length")) >= 1
    block = browser.eval("document.getElementById('block').innerText")
    assert "opgate/eager" in block
    assert "torch/compile" in block
    assert int(browser.eval("document.querySelectorAll('#block .bar').length")) == 8  # 4 variants x 2 phases
    assert [u for u in browser.requested_urls() if not u.startswith(("file:", "data:"))] == []


def test_error_detection_catches_a_broken_page(browser: Page, tmp_path: Path) -> None:
    """The console-error check itself can fail: a page that throws is reported."""
    page = tmp_path / "broken.html"
    page.write_text("<!DOCTYPE html><title>x</title><script>console.error('boom'); undefinedFn();</script>")
    before = len(browser.errors())
    browser.open(page.as_uri())
    new = browser.errors()[before:]
    assert any("undefinedFn" in e for e in new), new
    assert any("boom" in e for e in new)


def test_expected_slots_counts_multi_environment_cells_once() -> None:
    doc: dict[str, Any] = defaultdict(list)
    names = ("op", "impl", "torch", "cuda", "arch", "dtype", "layout", "mode", "shapes")
    axes = dict(
        zip(names, ("a", "t", "2.13.0", "13.0", "sm_90", "all", "all", "build", "default"), strict=True)
    )
    doc["cells"] = [{"axes": axes, "verdict": "pass"}, {"axes": axes, "verdict": "fail"}]
    assert expected_slots(doc) == 1
    assert expected_slots(doc, verdict="fail") == 1
