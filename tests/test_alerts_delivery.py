"""Delivery under failure: retries, Retry-After, error codes in 200s, timeouts, secrets, dedup.

All against a real HTTP server on 127.0.0.1.  The command-line tests run
``opgate alert`` as a subprocess and capture everything it prints,
so "the secret never appears" is checked on real output, not on a mock.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from opgate.matrix.errors import AlertDeliveryFailed, UsageError
from opgate.reports.alerts.dedup import DedupState
from opgate.reports.alerts.message import fit
from opgate.reports.alerts.registry import PLATFORMS
from opgate.reports.alerts.send import send
from opgate.reports.alerts.transport import Redactor, Response, RetryPolicy, redact_url, retry_after
from tests.data.reports.fixtures import regression_diff
from tests.data.reports.receiver import Receiver, Reply, serve

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "T0K3N-abcdef-SECRET-7788"
SLACK_PATH = f"/services/T01/B02/{TOKEN}"
FEISHU_SECRET = "feishu-signing-secret-QWERTY12"
FAST = RetryPolicy(timeout=5.0, attempts=4, backoff=0.01, max_wait=0.05)


@pytest.fixture(scope="module")
def diff_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("diff")
    regression_diff(root)
    return root / "diff.json"


@pytest.fixture(scope="module")
def diff_doc(diff_file: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(diff_file.read_text())
    return doc


@pytest.fixture
def slack() -> Iterator[Receiver]:
    with serve(Reply(200, "ok")) as receiver:
        yield receiver


class Sleeps:
    """Records the delays the transport asked for, without sleeping."""

    def __init__(self) -> None:
        self.calls: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


def send_slack(
    doc: dict[str, Any], receiver: Receiver, policy: RetryPolicy = FAST, **kw: Any
) -> tuple[int, str]:
    log, sleeps = io.StringIO(), kw.pop("sleeps", Sleeps())
    env = {"OPGATE_SLACK_WEBHOOK_URL": receiver.url(SLACK_PATH)}
    sent = send(doc, "slack", env, run_id="77", policy=policy, log=log, sleep=sleeps, **kw)
    return sent, log.getvalue()


def test_503_is_retried_with_exponential_backoff(slack: Receiver, diff_doc: dict[str, Any]) -> None:
    slack.reply(Reply(503, "busy"), Reply(503, "busy"))
    sleeps = Sleeps()
    policy = RetryPolicy(timeout=5.0, attempts=4, backoff=0.01, max_wait=10.0)
    sent, log = send_slack(diff_doc, slack, policy, sleeps=sleeps)
    assert sent == 4
    assert len(slack.requests) == 3
    assert sleeps.calls == [0.01, 0.02]
    assert "HTTP 503" in log
    assert "retry 1/3" in log
    assert "retry 2/3" in log
    assert len({r.body for r in slack.requests}) == 1  # the same message each time


@pytest.mark.parametrize("status", [500, 502, 504])
def test_5xx_that_may_have_posted_is_final(slack: Receiver, diff_doc: dict[str, Any], status: int) -> None:
    """After a 500/502/504 the platform may have posted: a retry could make a second copy."""
    slack.reply(Reply(status, "oops"))
    with pytest.raises(AlertDeliveryFailed, match=rf"after 1 attempt\(s\): HTTP {status}") as info:
        send_slack(diff_doc, slack)
    assert len(slack.requests) == 1
    assert "may have received it" in str(info.value)
    assert info.value.exit_code == 8


def test_503_until_attempts_run_out_fails(slack: Receiver, diff_doc: dict[str, Any]) -> None:
    slack.reply(*[Reply(503, "unavailable")] * 4)
    with pytest.raises(AlertDeliveryFailed, match=r"after 4 attempt\(s\): HTTP 503") as info:
        send_slack(diff_doc, slack)
    assert len(slack.requests) == 4
    assert info.value.exit_code == 8
    assert "may have received it" not in str(info.value)


def test_generic_webhook_retries_unclear_failures_with_one_idempotency_key(diff_doc: dict[str, Any]) -> None:
    with serve(Reply(200, "")) as receiver:
        receiver.reply(Reply(502, "bad gateway"), Reply(500, "oops"))
        env = {"OPGATE_WEBHOOK_URL": receiver.url("/hook")}
        assert send(diff_doc, "webhook", env, run_id="1", policy=FAST, log=io.StringIO(), sleep=Sleeps()) == 4
    keys = {r.headers.get("Idempotency-Key") for r in receiver.requests}
    assert len(receiver.requests) == 3
    assert len(keys) == 1
    assert None not in keys
    assert {r.json()["idempotency_key"] for r in receiver.requests} == keys


def test_429_honours_retry_after_and_caps_it(slack: Receiver, diff_doc: dict[str, Any]) -> None:
    slack.reply(Reply(429, "rate_limited", {"Retry-After": "2"}), Reply(429, "", {"Retry-After": "3600"}))
    sleeps = Sleeps()
    policy = RetryPolicy(timeout=5.0, attempts=4, backoff=0.01, max_wait=2.5)
    sent, _ = send_slack(diff_doc, slack, policy, sleeps=sleeps)
    assert sent == 4
    assert len(slack.requests) == 3
    assert sleeps.calls == [2.0, 2.5]  # the server's 2 s, then 3600 s capped at max_wait


def test_discord_json_retry_after(diff_doc: dict[str, Any]) -> None:
    with serve(Reply(200, '{"id": "9"}')) as receiver:
        receiver.reply(
            Reply(429, json.dumps({"message": "rate limited", "retry_after": 0.25, "global": False}))
        )
        sleeps = Sleeps()
        env = {"OPGATE_DISCORD_WEBHOOK_URL": receiver.url("/api/webhooks/1/tok")}
        policy = RetryPolicy(timeout=5.0, attempts=3, backoff=5.0, max_wait=10.0)
        assert send(diff_doc, "discord", env, run_id="1", policy=policy, log=io.StringIO(), sleep=sleeps) == 4
    assert sleeps.calls == [0.25]


def test_retry_after_http_date() -> None:
    answer = Response(429, "", {"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"})
    assert retry_after(answer, now=1445412470.0) == pytest.approx(10.0)
    assert retry_after(Response(429, "", {}), now=0.0) is None


def test_4xx_is_final(slack: Receiver, diff_doc: dict[str, Any]) -> None:
    slack.reply(Reply(403, "invalid_token"))
    with pytest.raises(AlertDeliveryFailed, match=r"after 1 attempt\(s\): HTTP 403: 'invalid_token'"):
        send_slack(diff_doc, slack)
    assert len(slack.requests) == 1


ERROR_CODE_CASES = {
    "slack": ("no_service", "Slack answered 'no_service'"),
    "feishu": ('{"code": 19021, "msg": "sign match fail"}', "Feishu code 19021"),
    "dingtalk": (
        '{"errcode": 310000, "errmsg": "sign not match"}',
        "DingTalk errcode 310000: sign not match",
    ),
    "wecom": ('{"errcode": 93000, "errmsg": "invalid webhook url"}', "WeCom errcode 93000"),
}


@pytest.mark.parametrize("platform", sorted(ERROR_CODE_CASES))
def test_http_200_with_error_code_is_a_failure(
    platform: str, diff_doc: dict[str, Any], tmp_path: Path
) -> None:
    body, expected = ERROR_CODE_CASES[platform]
    env_name = PLATFORMS[platform].url_env
    state = tmp_path / "state.json"
    with serve(Reply(200, body)) as receiver:
        env = {env_name: receiver.url("/hook?key=abcdefgh")}
        with pytest.raises(AlertDeliveryFailed, match=expected):
            send(diff_doc, platform, env, run_id="5", state_path=state, policy=FAST, log=io.StringIO())
        assert len(receiver.requests) == 1  # a definite refusal is not retried
    assert not state.exists()  # nothing recorded as sent


def test_feishu_rate_limit_code_is_retried(diff_doc: dict[str, Any]) -> None:
    with serve(Reply(200, '{"code": 0, "msg": "success"}')) as receiver:
        receiver.reply(Reply(200, '{"code": 11232, "msg": "frequency limited"}'))
        env = {"OPGATE_FEISHU_WEBHOOK_URL": receiver.url("/open-apis/bot/v2/hook/abc")}
        assert send(diff_doc, "feishu", env, run_id="1", policy=FAST, log=io.StringIO(), sleep=Sleeps()) == 4
        assert len(receiver.requests) == 2


def test_timeout_after_sending_is_reported_not_retried(slack: Receiver, diff_doc: dict[str, Any]) -> None:
    slack.reply(Reply(200, "ok", delay=3.0), Reply(200, "ok", delay=3.0))
    policy = RetryPolicy(timeout=1.0, attempts=2, backoff=0.01, max_wait=0.05)
    with pytest.raises(AlertDeliveryFailed, match="deadline reached") as info:
        send_slack(diff_doc, slack, policy)
    assert len(slack.requests) == 1  # the platform may have it: never a second copy
    assert "may have received it" in str(info.value)
    assert TOKEN not in str(info.value)


def test_connection_refused_is_reported_without_the_url(diff_doc: dict[str, Any]) -> None:
    with serve(Reply()) as receiver:
        url = receiver.url(SLACK_PATH)
    env = {"OPGATE_SLACK_WEBHOOK_URL": url}  # the server is gone: nothing listens there now
    with pytest.raises(AlertDeliveryFailed) as info:
        send(diff_doc, "slack", env, run_id="1", policy=FAST, log=io.StringIO(), sleep=Sleeps())
    message = str(info.value)
    assert "after 4 attempt(s)" in message
    assert redact_url(url) in message
    assert TOKEN not in message
    assert SLACK_PATH not in message


def test_missing_or_bad_url_names_the_variable_only(diff_doc: dict[str, Any]) -> None:
    with pytest.raises(UsageError, match="OPGATE_TEAMS_WEBHOOK_URL is not set"):
        send(diff_doc, "teams", {}, run_id="1")
    with pytest.raises(AlertDeliveryFailed, match=r"OPGATE_WEBHOOK_URL is not an http\(s\) URL") as info:
        send(diff_doc, "webhook", {"OPGATE_WEBHOOK_URL": f"ftp://host/{TOKEN}"}, run_id="1")
    assert TOKEN not in str(info.value)
    with pytest.raises(UsageError, match="unknown platform 'irc'"):
        send(diff_doc, "irc", {}, run_id="1")


def test_redactor_scrubs_url_parts_and_encodings() -> None:
    redactor = Redactor()
    redactor.add_url("https://oapi.example/robot/send?access_token=tok123456789&x=1")
    redactor.add("sec/ret+value==")
    text = "echo tok123456789 /robot/send?access_token=tok123456789 sec%2Fret%2Bvalue%3D%3D sec/ret+value=="
    redacted = redactor.scrub(text)
    assert "tok123456789" not in redacted
    assert "sec/ret+value==" not in redacted
    assert redact_url("https://user:pw@hooks.example:8443/a/b?c=d") == "https://hooks.example:8443"


def test_fit_finds_the_largest_prefix() -> None:
    calls: list[int] = []

    def build(k: int) -> list[int]:
        calls.append(k)
        return list(range(k))

    assert fit(build, 100, lambda p: len(p) <= 37) == list(range(37))
    assert fit(build, 10, lambda p: True) == list(range(10))
    assert fit(build, 10, lambda p: False) == []  # headline only, never nothing
    assert len(calls) < 20


# ---------------------------------------------------------------------- the command line


def run_cli(diff_file: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("OPGATE_", "GITHUB_"))}
    return subprocess.run(
        [sys.executable, "-m", "opgate.reports", "alert", "--diff", str(diff_file), *args],
        cwd=ROOT,
        env={**base_env, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.integration
def test_cli_never_leaks_the_url_token_or_secret(diff_file: Path, tmp_path: Path) -> None:
    """A hostile server echoes the request path and the secret back; none of it may be printed."""
    state = tmp_path / "state.json"
    echo = f"bad request for {SLACK_PATH} signed with {FEISHU_SECRET} token={TOKEN}"
    with serve(Reply(500, echo)) as receiver:
        env = {"OPGATE_FEISHU_WEBHOOK_URL": receiver.url(SLACK_PATH), "OPGATE_FEISHU_SECRET": FEISHU_SECRET}
        failed = run_cli(diff_file, env, "--platform", "feishu", "--run-id", "9", "--state", str(state),
                         "--attempts", "2", "--backoff", "0.01")  # fmt: skip
        receiver.script.clear()
        receiver.default = Reply(200, '{"code": 0, "msg": "success"}')
        ok = run_cli(diff_file, env, "--platform", "feishu", "--run-id", "9", "--state", str(state))
    assert failed.returncode == AlertDeliveryFailed.exit_code, failed.stderr
    assert "HTTP 500" in failed.stderr
    assert f"http://127.0.0.1:{receiver.port}" in failed.stderr
    assert "***" in failed.stderr  # the echo was scrubbed, not dropped
    assert ok.returncode == 0, ok.stderr
    outputs = [failed.stdout, failed.stderr, ok.stdout, ok.stderr, state.read_text()]
    for secret in (TOKEN, FEISHU_SECRET, SLACK_PATH, receiver.url(SLACK_PATH)):
        for text in outputs:
            assert secret not in text
    assert "Traceback" not in failed.stderr


@pytest.mark.integration
def test_cli_dedups_across_invocations(diff_file: Path, tmp_path: Path) -> None:
    state = tmp_path / "alerts-state.json"
    with serve(Reply(200, "ok")) as receiver:
        env = {"OPGATE_SLACK_WEBHOOK_URL": receiver.url(SLACK_PATH), "GITHUB_RUN_ID": "123456"}
        args = ("--platform", "slack", "--state", str(state), "--report-url", "https://ci.example/r")
        first = run_cli(diff_file, env, *args)
        second = run_cli(diff_file, env, *args)
        assert len(receiver.requests) == 1
        other_run = run_cli(diff_file, {**env, "GITHUB_RUN_ID": "123457"}, *args)
        other_platform_env = {"OPGATE_WEBHOOK_URL": receiver.url("/generic"), "GITHUB_RUN_ID": "123456"}
        other_platform = run_cli(
            diff_file, other_platform_env, "--platform", "webhook", "--state", str(state)
        )
        assert len(receiver.requests) == 3
    for result in (first, second, other_run, other_platform):
        assert result.returncode == 0, result.stderr
    assert "sent 4 regression(s)" in first.stderr
    assert "nothing new to send for run 123456" in second.stderr
    keys = set(json.loads(state.read_text())["sent"])
    assert "slack|123456|rms_norm.triton-pt2.13-cpu-fp32-contiguous-eager@cpu|new_failure" in keys
    assert len(keys) == 12  # 4 regressions x (slack run 1, slack run 2, webhook run 1)


def test_failed_delivery_is_not_recorded_and_is_retried_next_time(
    diff_doc: dict[str, Any], tmp_path: Path
) -> None:
    state = tmp_path / "state.json"
    with serve(Reply(200, "ok")) as receiver:
        receiver.reply(*[Reply(503, "down")] * 4)
        env = {"OPGATE_SLACK_WEBHOOK_URL": receiver.url(SLACK_PATH)}
        with pytest.raises(AlertDeliveryFailed):
            send(
                diff_doc,
                "slack",
                env,
                run_id="r1",
                state_path=state,
                policy=FAST,
                log=io.StringIO(),
                sleep=Sleeps(),
            )
        assert not state.exists() or DedupState.load(state).sent == {}
        assert (
            send(diff_doc, "slack", env, run_id="r1", state_path=state, policy=FAST, log=io.StringIO()) == 4
        )
        assert (
            send(diff_doc, "slack", env, run_id="r1", state_path=state, policy=FAST, log=io.StringIO()) == 0
        )
        assert len(receiver.requests) == 5


def test_corrupt_state_file_is_a_clear_error(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    state.write_text("{not json")
    with pytest.raises(Exception, match="alert state is not valid JSON"):
        DedupState.load(state)
