"""Every alert is delivered exactly once, or reported as not delivered (exit 8), never both.

Real HTTP servers on loopback play each platform (Slack, Feishu, DingTalk,
WeCom, Teams, Discord, the generic webhook) and misbehave: redirects (301,
302, 303, 307, 308), a receiver that trickles its answer a byte at a time,
one that never answers, 4xx, 5xx, 503 then OK, 429 with ``Retry-After``,
connection refused.  For each, the receiver's own record decides: a delivery
is a complete 2xx answer that reached a client still listening, and for the
generic webhook (which carries an ``Idempotency-Key``) repeats of one key
count once.  ``delivered == 1`` when the sender reports success, ``0`` when
it reports exit 8.  Every platform is run through every fault; the command
line is run for the state file cases (unwritable, default location, two
processes at once) and for SIGTERM.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from opgate.matrix.errors import AlertDeliveryFailed
from opgate.reports.alerts.registry import PLATFORMS
from opgate.reports.alerts.send import send
from opgate.reports.alerts.transport import RetryPolicy
from tests.data.reports.fixtures import regression_diff
from tests.data.reports.receiver import Receiver, Reply, serve

ROOT = Path(__file__).resolve().parent.parent
OK_BODY = {
    "slack": "ok",
    "feishu": '{"code": 0, "msg": "success"}',
    "dingtalk": '{"errcode": 0, "errmsg": "ok"}',
    "wecom": '{"errcode": 0, "errmsg": "ok"}',
    "teams": "",
    "discord": '{"id": "1"}',
    "webhook": "",
}
PATH = "/hook/T0K3N-abcdefgh"
DEADLINE = RetryPolicy(timeout=1.0, attempts=4, backoff=0.01, max_wait=0.05)


@pytest.fixture(scope="module")
def diff_doc(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return regression_diff(tmp_path_factory.mktemp("diff"))


@pytest.fixture(scope="module")
def diff_file(diff_doc: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("difffile") / "diff.json"
    import json

    path.write_text(json.dumps(diff_doc))
    return path


@pytest.fixture(params=sorted(PLATFORMS))
def platform(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def receiver(platform: str) -> Iterator[Receiver]:
    with serve(Reply(200, OK_BODY[platform])) as server:
        yield server


class Sleeps(list[float]):
    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def deliver(platform: str, receiver: Receiver, diff_doc: dict[str, Any], policy: RetryPolicy = DEADLINE,
            **kw: Any) -> tuple[int, str, float]:  # fmt: skip
    """(exit code the CLI would give, what it said, seconds it took) for one ``send``."""
    log = io.StringIO()
    env = {PLATFORMS[platform].url_env: receiver.url(PATH)}
    t0 = time.monotonic()
    try:
        send(diff_doc, platform, env, run_id="r1", policy=policy, log=log, **kw)
        code = 0
    except AlertDeliveryFailed as err:
        log.write(err.message())
        code = err.exit_code
    return code, log.getvalue(), time.monotonic() - t0


def exactly_once_or_reported(code: int, receiver: Receiver, platform: str) -> int:
    """The invariant: success <=> exactly one delivery; exit 8 <=> none.  Returns deliveries."""
    key = "Idempotency-Key" if PLATFORMS[platform].idempotent else None
    delivered = receiver.delivered(key)
    assert code in (0, AlertDeliveryFailed.exit_code)
    assert delivered == (1 if code == 0 else 0), (code, receiver.answered)
    return delivered


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_redirect_is_refused_never_followed(
    platform: str, receiver: Receiver, diff_doc: dict[str, Any], status: int
) -> None:
    receiver.reply(Reply(status, "", {"Location": receiver.url("/moved")}))
    code, said, _ = deliver(platform, receiver, diff_doc)
    exactly_once_or_reported(code, receiver, platform)
    assert code == 8
    assert f"HTTP {status} redirect" in said
    assert [r.method for r in receiver.requests] == ["POST"]  # never re-sent, as a GET or at all
    assert "T0K3N" not in said


def test_trickling_receiver_cannot_hold_the_delivery_past_its_deadline(
    platform: str, receiver: Receiver, diff_doc: dict[str, Any]
) -> None:
    receiver.default = Reply(200, OK_BODY[platform] + " " * 40, trickle=0.25)
    code, said, seconds = deliver(platform, receiver, diff_doc)
    exactly_once_or_reported(code, receiver, platform)
    assert code == 8
    assert seconds < DEADLINE.timeout + 1.0
    assert "deadline reached" in said
    if not PLATFORMS[platform].idempotent:
        assert len(receiver.posts()) == 1  # it may have the message: never a second copy


def test_silent_receiver_is_one_attempt_within_the_deadline(
    platform: str, receiver: Receiver, diff_doc: dict[str, Any]
) -> None:
    receiver.default = Reply(200, OK_BODY[platform], delay=DEADLINE.timeout + 2.0)
    code, said, seconds = deliver(platform, receiver, diff_doc)
    exactly_once_or_reported(code, receiver, platform)
    assert code == 8
    assert seconds < DEADLINE.timeout + 1.0
    if PLATFORMS[platform].idempotent:
        assert "Idempotency-Key" in said
    else:
        assert len(receiver.posts()) == 1
        assert "may have received it" in said


@pytest.mark.parametrize("status", [400, 403, 404, 410])
def test_4xx_is_final(platform: str, receiver: Receiver, diff_doc: dict[str, Any], status: int) -> None:
    receiver.default = Reply(status, "invalid_token")
    code, said, _ = deliver(platform, receiver, diff_doc)
    exactly_once_or_reported(code, receiver, platform)
    assert code == 8
    assert len(receiver.posts()) == 1
    assert f"HTTP {status}" in said


@pytest.mark.parametrize("status", [500, 502, 504])
def test_5xx_that_may_have_posted_is_retried_only_with_an_idempotency_key(
    platform: str, receiver: Receiver, diff_doc: dict[str, Any], status: int
) -> None:
    receiver.reply(Reply(status, "oops"))
    code, _, _ = deliver(platform, receiver, diff_doc, sleep=Sleeps())
    exactly_once_or_reported(code, receiver, platform)
    if PLATFORMS[platform].idempotent:
        assert code == 0
        assert len(receiver.posts()) == 2
        assert len({r.headers["Idempotency-Key"] for r in receiver.posts()}) == 1
    else:
        assert code == 8
        assert len(receiver.posts()) == 1


def test_503_then_ok_is_delivered_once(platform: str, receiver: Receiver, diff_doc: dict[str, Any]) -> None:
    receiver.reply(Reply(503, "unavailable"), Reply(503, "unavailable"))
    code, _, _ = deliver(platform, receiver, diff_doc, sleep=Sleeps())
    assert exactly_once_or_reported(code, receiver, platform) == 1
    assert len(receiver.posts()) == 3


def test_429_waits_as_told_then_delivers_once(
    platform: str, receiver: Receiver, diff_doc: dict[str, Any]
) -> None:
    receiver.reply(Reply(429, '{"retry_after": 0.04}', {"Retry-After": "0.03"}))
    sleeps = Sleeps()
    code, _, _ = deliver(platform, receiver, diff_doc, sleep=sleeps)
    assert exactly_once_or_reported(code, receiver, platform) == 1
    assert sleeps == [0.03]  # the header wins over the body


def test_429_forever_is_reported_after_the_attempts(
    platform: str, receiver: Receiver, diff_doc: dict[str, Any]
) -> None:
    receiver.default = Reply(429, "slow down", {"Retry-After": "0"})
    code, said, _ = deliver(platform, receiver, diff_doc, sleep=Sleeps())
    exactly_once_or_reported(code, receiver, platform)
    assert code == 8
    assert len(receiver.posts()) == DEADLINE.attempts
    assert "HTTP 429" in said


def test_connection_refused_is_retried_then_reported(platform: str, diff_doc: dict[str, Any]) -> None:
    with serve(Reply()) as gone:
        pass  # nothing listens on its port any more
    code, said, _ = deliver(platform, gone, diff_doc, sleep=Sleeps())
    assert code == 8
    assert f"after {DEADLINE.attempts} attempt(s)" in said
    assert gone.requests == []


def test_retry_after_longer_than_the_deadline_is_not_waited_for(diff_doc: dict[str, Any]) -> None:
    with serve(Reply(200, "ok")) as receiver:
        receiver.reply(Reply(429, "", {"Retry-After": "30"}))
        policy = RetryPolicy(timeout=1.0, attempts=4, backoff=0.01, max_wait=60.0)
        code, said, seconds = deliver("slack", receiver, diff_doc, policy)
    assert code == 8
    assert "no time left for a retry" in said
    assert seconds < 1.0
    assert receiver.delivered() == 0


def test_real_retry_after_is_honoured(diff_doc: dict[str, Any]) -> None:
    with serve(Reply(200, "ok")) as receiver:
        receiver.reply(Reply(429, "", {"Retry-After": "1"}))
        policy = RetryPolicy(timeout=10.0, attempts=3, backoff=5.0, max_wait=5.0)
        code, _, seconds = deliver("slack", receiver, diff_doc, policy)
    assert code == 0
    assert 1.0 <= seconds < 3.0
    assert receiver.delivered() == 1


# ---------------------------------------------------------------------- the command line: state


def cli(diff_file: Path, env: dict[str, str], *args: str, wait: bool = True) -> Any:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OPGATE_", "GITHUB_", "XDG_STATE"))}
    argv = [
        sys.executable,
        "-m",
        "opgate.reports",
        "alert",
        "--diff",
        str(diff_file),
        "--run-id",
        "r9",
        *args,
    ]
    if not wait:
        return subprocess.Popen(argv, cwd=ROOT, env={**base, **env}, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)  # fmt: skip
    return subprocess.run(argv, cwd=ROOT, env={**base, **env}, capture_output=True, text=True, timeout=120,
                          check=False)  # fmt: skip


@pytest.mark.integration
def test_unwritable_state_refuses_before_posting_and_a_rerun_posts_once(
    diff_file: Path, tmp_path: Path
) -> None:
    with serve(Reply(200, "ok")) as receiver:
        env = {"OPGATE_SLACK_WEBHOOK_URL": receiver.url(PATH)}
        refused = cli(diff_file, env, "--platform", "slack", "--state", "/sys/opgate-alerts/sent.json")
        assert refused.returncode == 8, refused.stderr
        assert "nothing was sent" in refused.stderr
        assert receiver.requests == []
        state = tmp_path / "sent.json"
        first = cli(diff_file, env, "--platform", "slack", "--state", str(state))
        again = cli(diff_file, env, "--platform", "slack", "--state", str(state))
    assert (first.returncode, again.returncode) == (0, 0), first.stderr + again.stderr
    assert receiver.delivered() == 1
    assert "nothing new to send" in again.stderr
    for run in (refused, first, again):
        assert "Traceback" not in run.stderr


@pytest.mark.integration
def test_default_state_dedups_two_runs_and_no_state_says_it_posts_again(
    diff_file: Path, tmp_path: Path
) -> None:
    with serve(Reply(200, "ok")) as receiver:
        env = {"OPGATE_SLACK_WEBHOOK_URL": receiver.url(PATH), "XDG_STATE_HOME": str(tmp_path / "xdg")}
        runs = [cli(diff_file, env, "--platform", "slack") for _ in range(2)]
        assert receiver.delivered() == 1
        assert (tmp_path / "xdg" / "opgate" / "alerts-sent.json").is_file()
        blind = [cli(diff_file, env, "--platform", "slack", "--no-state") for _ in range(2)]
        assert receiver.delivered() == 3
    assert [r.returncode for r in runs + blind] == [0, 0, 0, 0]
    assert "nothing new to send" in runs[1].stderr
    assert "a re-run posts the same regressions again" in blind[0].stderr


@pytest.mark.integration
def test_two_alert_processes_sharing_a_state_post_once(diff_file: Path, tmp_path: Path) -> None:
    state = tmp_path / "sent.json"
    with serve(Reply(200, "ok", delay=0.5)) as receiver:  # slow answers: both overlap
        env = {"OPGATE_SLACK_WEBHOOK_URL": receiver.url(PATH)}
        procs = [
            cli(diff_file, env, "--platform", "slack", "--state", str(state), wait=False) for _ in range(2)
        ]
        outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert receiver.delivered() == 1
    assert sum("nothing new to send" in err for _, err in outs) == 1


@pytest.mark.integration
def test_sigterm_mid_delivery_exits_130_without_a_traceback(diff_file: Path) -> None:
    with serve(Reply(200, "ok", delay=30.0)) as receiver:
        env = {"OPGATE_SLACK_WEBHOOK_URL": receiver.url(PATH)}
        proc = cli(diff_file, env, "--platform", "slack", "--no-state", "--timeout", "60", wait=False)
        deadline = time.monotonic() + 30
        while not receiver.requests and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    assert proc.returncode == 130, err
    assert "interrupted" in err
    assert "Traceback" not in err
    assert receiver.delivered() == 0


def test_a_post_given_up_while_connecting_is_never_sent_later(monkeypatch: pytest.MonkeyPatch) -> None:
    """A name lookup that outlasts the deadline cannot be interrupted (no socket to shut down yet):
    the caller reports "not delivered" (phase connect: safe to send again), so the helper thread,
    connected at last, must not post it then."""
    import http.client

    from opgate.reports.alerts.exchange import ExchangeFailed, Phase, post
    from tests.data.reports.receiver import serve

    connect = http.client.HTTPConnection.connect

    def slow_lookup(self: http.client.HTTPConnection) -> None:
        time.sleep(2.0)  # past the deadline and the caller's grace second
        connect(self)

    monkeypatch.setattr(http.client.HTTPConnection, "connect", slow_lookup)
    with serve(Reply(200, "ok")) as receiver:
        t0 = time.monotonic()
        with pytest.raises(ExchangeFailed) as failed:
            post(receiver.url(PATH), b"{}", {"Content-Type": "application/json"}, time.monotonic() + 0.3)
        assert failed.value.phase is Phase.CONNECT
        assert time.monotonic() - t0 < 2.0
        time.sleep(2.5)  # the lookup ends, the thread connects
        assert receiver.posts() == []


@pytest.mark.integration
def test_an_alert_under_a_fixed_source_date_epoch_is_still_sent_once(diff_file: Path, tmp_path: Path) -> None:
    """SOURCE_DATE_EPOCH fixes a report's date (reproducible builds set it to the last commit's):
    the alert state records when it really sent, else an old date is pruned at once and the next
    run sends again; a value that is not a time does not stop the alert either."""
    with serve(Reply(200, "ok")) as receiver:
        env = {"OPGATE_SLACK_WEBHOOK_URL": receiver.url(PATH), "SOURCE_DATE_EPOCH": "1700000000"}  # 2023
        sent = cli(diff_file, env, "--platform", "slack", "--state", str(tmp_path / "sent.json"))
        again = cli(diff_file, env, "--platform", "slack", "--state", str(tmp_path / "sent.json"))
        env["SOURCE_DATE_EPOCH"] = "abc"
        third = cli(diff_file, env, "--platform", "slack", "--state", str(tmp_path / "sent.json"))
    assert (sent.returncode, again.returncode, third.returncode) == (0, 0, 0), sent.stderr + again.stderr
    assert receiver.delivered() == 1
    for run in (sent, again, third):
        assert "Traceback" not in run.stderr
