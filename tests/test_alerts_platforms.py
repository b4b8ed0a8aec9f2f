"""Each platform's payload and signature, checked on a real loopback receiver.

The diff comes from two real publishes (a head with a planted new failure, a
new fallback and a 10% slowdown), and each platform must carry all three
regressions in its own format, within its own limits.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import hmac
import io
import json
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from opgate.reports.alerts import dingtalk, discord, feishu, wecom
from opgate.reports.alerts.registry import PLATFORMS
from opgate.reports.alerts.send import send
from opgate.reports.alerts.transport import RetryPolicy
from opgate.reports.compat import validate_document
from opgate.reports.diff import DIFF_SCHEMA_FILE
from tests.data.reports.fixtures import NEW_FAILURE, NEW_FALLBACK, PERF_CELL, regression_diff
from tests.data.reports.receiver import Receiver, Reply, serve

REPORT_URL = "https://ci.example.org/opgate/run/42/index.html"
FEISHU_SECRET = "feishu-sign-secret-7f3a9c"
DINGTALK_SECRET = "SECdingtalk0d1e2f3a4b5c6d7e8f"
OK_REPLIES = {
    "slack": Reply(200, "ok"),
    "feishu": Reply(200, json.dumps({"code": 0, "msg": "success", "data": {}})),
    "dingtalk": Reply(200, json.dumps({"errcode": 0, "errmsg": "ok"})),
    "wecom": Reply(200, json.dumps({"errcode": 0, "errmsg": "ok"})),
    "teams": Reply(202, ""),
    "discord": Reply(200, json.dumps({"id": "1", "content": "..."})),
    "webhook": Reply(204, ""),
}
PATHS = {
    "slack": "/services/T000/B000/XXXXslacktokenXXXX",
    "feishu": "/open-apis/bot/v2/hook/feishu-hook-token-1234",
    "dingtalk": "/robot/send?access_token=dingtalk-access-token-5678",
    "wecom": "/cgi-bin/webhook/send?key=wecom-key-0000-1111",
    "teams": "/workflows/abc/triggers/manual/paths/invoke?sig=teams-sig-abcdef",
    "discord": "/api/webhooks/123456/discord-token-zyxw",
    "webhook": "/hooks/opgate-generic-token-9999",
}


@pytest.fixture(scope="module")
def diff_doc(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return regression_diff(tmp_path_factory.mktemp("diff"))


def env_for(name: str, receiver: Receiver) -> dict[str, str]:
    platform = PLATFORMS[name]
    env = {platform.url_env: receiver.url(PATHS[name])}
    if name == "feishu":
        env[feishu.SECRET_ENV] = FEISHU_SECRET
    if name == "dingtalk":
        env[dingtalk.SECRET_ENV] = DINGTALK_SECRET
    return env


@pytest.fixture(params=sorted(PLATFORMS))
def platform_server(request: pytest.FixtureRequest) -> Iterator[tuple[str, Receiver]]:
    with serve(OK_REPLIES[request.param]) as receiver:
        yield request.param, receiver


def deliver(name: str, receiver: Receiver, doc: dict[str, Any]) -> tuple[int, str]:
    log = io.StringIO()
    policy = RetryPolicy(timeout=5.0, attempts=2, backoff=0.01, max_wait=0.05)
    sent = send(
        doc, name, env_for(name, receiver), run_id="4242", report_url=REPORT_URL, policy=policy, log=log
    )
    return sent, log.getvalue()


def check_slack(body: dict[str, Any], text: str) -> None:
    blocks = body["blocks"]
    assert body["text"].startswith("opgate: ")
    assert blocks[0]["type"] == "header"
    assert blocks[0]["text"]["type"] == "plain_text"
    assert len(blocks[0]["text"]["text"]) <= 150
    assert all(len(b["text"]["text"]) <= 3000 for b in blocks if b["type"] == "section")
    assert len(blocks) <= 50
    assert blocks[-1]["type"] == "context"
    assert f"<{REPORT_URL}|Full report>" in blocks[-1]["elements"][0]["text"]


def check_feishu(body: dict[str, Any], text: str) -> None:
    timestamp = body["timestamp"]
    assert abs(int(timestamp) - time.time()) < 60
    expected = base64.b64encode(
        hmac.new(f"{timestamp}\n{FEISHU_SECRET}".encode(), b"", hashlib.sha256).digest()
    )
    assert body["sign"] == expected.decode()
    assert body["msg_type"] == "interactive"
    assert isinstance(body["card"], dict)
    assert "new failure" in body["card"]["header"]["title"]["content"]
    button = body["card"]["elements"][-1]["actions"][0]
    assert button["url"] == REPORT_URL


def check_dingtalk(body: dict[str, Any], text: str, query: dict[str, str]) -> None:
    assert query["access_token"] == "dingtalk-access-token-5678"
    timestamp = query["timestamp"]
    assert abs(int(timestamp) / 1000 - time.time()) < 60
    digest = hmac.new(DINGTALK_SECRET.encode(), f"{timestamp}\n{DINGTALK_SECRET}".encode(), hashlib.sha256)
    assert query["sign"] == base64.b64encode(digest.digest()).decode()  # parse_qsl undid the URL encoding
    assert body["msgtype"] == "markdown"
    assert body["markdown"]["title"].startswith("opgate")
    assert len(body["markdown"]["text"].encode()) <= dingtalk.MAX_TEXT


def check_wecom(body: dict[str, Any], text: str) -> None:
    assert body["msgtype"] == "markdown"
    assert len(body["markdown"]["content"].encode()) <= wecom.MAX_CONTENT


def check_teams(body: dict[str, Any], text: str) -> None:
    assert body["type"] == "message"
    attachment = body["attachments"][0]
    assert attachment["contentType"] == "application/vnd.microsoft.card.adaptive"
    assert attachment["contentUrl"] is None
    card = attachment["content"]
    assert card["type"] == "AdaptiveCard"
    assert card["version"] == "1.4"
    assert card["$schema"] == "http://adaptivecards.io/schemas/adaptive-card.json"
    assert all(block["type"] == "TextBlock" for block in card["body"])
    assert card["actions"] == [{"type": "Action.OpenUrl", "title": "Full report", "url": REPORT_URL}]
    assert len(json.dumps(body).encode()) <= 28 * 1024


def check_discord(body: dict[str, Any], text: str, query: dict[str, str]) -> None:
    assert query == {"wait": "true"}
    assert body["allowed_mentions"] == {"parse": []}
    assert len(body["content"]) <= 2000
    embed = body["embeds"][0]
    assert len(body["embeds"]) <= 10
    assert len(embed["description"]) <= discord.DESCRIPTION_MAX
    assert embed["url"] == REPORT_URL


def check_webhook(body: dict[str, Any], text: str) -> None:
    assert body["schema"] == "urn:opgate:schema:alert:1"
    assert body["run_id"] == "4242"
    assert body["report_url"] == REPORT_URL
    assert {i["kind"] for i in body["items"]} == {"new_failure", "new_fallback", "perf_regression"}
    assert body["omitted"] == 0


def test_payload_shape_and_signature(platform_server: tuple[str, Receiver], diff_doc: dict[str, Any]) -> None:
    name, receiver = platform_server
    sent, log = deliver(name, receiver, diff_doc)
    assert sent == 4  # new failure, new fallback, two perf regressions (two shapes)
    assert len(receiver.requests) == 1
    request = receiver.requests[0]
    assert request.headers["Content-Type"].startswith("application/json")
    body = request.json()
    text = json.dumps(body, ensure_ascii=False)
    for cell in (NEW_FAILURE, NEW_FALLBACK, PERF_CELL):
        assert cell in text, f"{name} payload lacks {cell}"
    assert "fix" not in {i.get("kind") for i in body.get("items", [])}
    checks = {"slack": check_slack, "feishu": check_feishu, "wecom": check_wecom, "teams": check_teams}
    checks.update({"webhook": check_webhook})
    if name in ("dingtalk", "discord"):
        {"dingtalk": check_dingtalk, "discord": check_discord}[name](body, text, request.query)
    else:
        checks[name](body, text)
    assert f"sent 4 regression(s) to http://127.0.0.1:{receiver.port}" in log
    assert ("does not confirm" in log) is (name == "teams")


def many_failures(doc: dict[str, Any], n: int) -> dict[str, Any]:
    big = copy.deepcopy(doc)
    template = big["new_failures"][0]
    big["new_failures"] = [
        {**template, "cell": f"{template['cell']}-s{i:04d}", "reason": "correctness: " + "x" * 150}
        for i in range(n)
    ]
    big["summary"]["new_failures"] = n
    validate_document(big, "synthetic diff", DIFF_SCHEMA_FILE)
    return big


def test_long_alert_is_truncated_within_limits(
    platform_server: tuple[str, Receiver], diff_doc: dict[str, Any]
) -> None:
    name, receiver = platform_server
    sent, _ = deliver(name, receiver, many_failures(diff_doc, 1000))
    assert sent == 1000 + 3
    body = receiver.requests[0].json()
    size = len(receiver.requests[0].body)
    text = json.dumps(body, ensure_ascii=False)
    limits = {"feishu": feishu.MAX_BODY, "teams": 28 * 1024, "webhook": 256 * 1024}
    if name in limits:
        assert size <= limits[name]
    if name == "webhook":
        assert 0 < body["omitted"] < 1003
        assert len(body["items"]) + body["omitted"] == 1003
    else:
        assert f"more: {REPORT_URL}" in text, f"{name}: no pointer to the full report"
        more = int(text.split("… and ", 1)[1].split(" more", 1)[0])
        assert 0 < more < 1003
    if name == "slack":
        check_slack(body, text)
    if name == "wecom":
        check_wecom(body, text)
    if name == "dingtalk":
        check_dingtalk(body, text, receiver.requests[0].query)
    if name == "discord":
        embed = body["embeds"][0]
        assert len(embed["description"]) <= discord.DESCRIPTION_MAX
        assert len(embed["title"]) + len(embed["description"]) <= discord.EMBED_TOTAL_MAX


def test_dingtalk_url_without_query_gets_its_own() -> None:
    url = dingtalk.signed_url("https://oapi.example/robot/send", "s3cret", 1700000000.0)
    query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))
    assert set(query) == {"timestamp", "sign"}
    assert query["timestamp"] == "1700000000000"


def test_unsigned_feishu_when_no_secret(diff_doc: dict[str, Any]) -> None:
    with serve(OK_REPLIES["feishu"]) as receiver:
        log = io.StringIO()
        env = {feishu.URL_ENV: receiver.url(PATHS["feishu"])}
        assert send(diff_doc, "feishu", env, run_id="1", log=log) == 4
        body = receiver.requests[0].json()
    assert "sign" not in body
    assert "timestamp" not in body
    assert "OPGATE_FEISHU_SECRET is not set; sending unsigned" in log.getvalue()


def test_diff_without_regressions_sends_nothing(diff_doc: dict[str, Any], tmp_path: Path) -> None:
    quiet = copy.deepcopy(diff_doc)
    for key in ("new_failures", "new_fallbacks", "perf_regressions"):
        quiet[key] = []
    with serve(OK_REPLIES["slack"]) as receiver:
        log = io.StringIO()
        env = {PLATFORMS["slack"].url_env: receiver.url(PATHS["slack"])}
        assert send(quiet, "slack", env, run_id="1", log=log) == 0
        assert receiver.requests == []
    assert "nothing new" in log.getvalue()


def test_each_item_links_its_cell_when_the_dashboard_is_known(diff_doc: dict[str, Any]) -> None:
    from opgate.reports.alerts.message import from_diff
    from opgate.reports.alerts.webhook import payload

    dashboard = "https://o.github.io/r/"
    alert = from_diff(diff_doc, "42", REPORT_URL, dashboard)
    failure = next(i for i in alert.items if i.cell == NEW_FAILURE)
    assert failure.text.endswith(f" {dashboard}#cell={NEW_FAILURE}")
    assert payload(alert, len(alert.items))["items"][0]["url"].startswith(dashboard + "#cell=")
    plain = from_diff(diff_doc, "42", REPORT_URL)
    assert all("#cell=" not in i.text and "url" not in i.to_json() for i in plain.items)
    assert [i.dedup_key for i in plain.items] == [i.dedup_key for i in alert.items]
