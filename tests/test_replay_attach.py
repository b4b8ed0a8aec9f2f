"""attach() never blocks an import on a compiler: without a cached build it builds in the background.

The library itself is stood in for (building it takes minutes; tests/test_replay.py
builds and exercises the real one where torch has CUDA headers): what is tested
is the attach bookkeeping — an op attached while the build runs is registered
once it is loaded, one attached after is registered at once, and a failed build
leaves every op on its Python path with the reason.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from opgate.ops import _replay as replay


class FakeLib:
    def __init__(self) -> None:
        self.registered: list[str] = []

    def opgate_replay_register(self, qualname: bytes, *args: Any) -> int:
        self.registered.append(qualname.decode())
        return 0


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.setattr(replay, "_STATE", {"lib": None, "why": None})
    monkeypatch.setattr(replay, "_IMPLS", {})
    monkeypatch.setattr(replay, "_PENDING", [])
    monkeypatch.setattr(replay, "_unavailable", lambda: None)
    monkeypatch.setattr(replay, "_cached", lambda: False)
    gate = threading.Event()
    fake = FakeLib()

    def slow_load() -> None:
        assert gate.wait(10), "the test never released the build"
        replay._STATE["lib"] = fake

    monkeypatch.setattr(replay, "_load", slow_load)
    return {"gate": gate, "lib": fake}


def test_ops_attached_during_the_build_are_registered_when_it_is_loaded(fresh: dict[str, Any]) -> None:
    assert replay.attach("ns::first", lambda: None) is False  # build started, import not blocked
    assert replay.attach("ns::second", lambda: None) is False
    assert fresh["lib"].registered == []
    fresh["gate"].set()
    replay._STATE["thread"].join(10)
    assert fresh["lib"].registered == ["ns::first", "ns::second"]
    assert replay.attach("ns::third", lambda: None) is True  # after the build: at once
    assert fresh["lib"].registered == ["ns::first", "ns::second", "ns::third"]


def test_a_failed_build_leaves_the_python_path_with_the_reason(
    fresh: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing_load() -> None:
        replay._STATE["why"] = "CudaBuildError: nvcc exploded"

    monkeypatch.setattr(replay, "_load", failing_load)
    assert replay.attach("ns::op", lambda: None) is False
    replay._STATE["thread"].join(10)
    assert replay.attach("ns::op", lambda: None) is False
    assert replay.status()["why_not"] == "CudaBuildError: nvcc exploded"
    assert replay._PENDING == []


def test_build_wait_builds_before_attach_returns(
    fresh: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """OPGATE_REPLAY_BUILD=wait: the op is on the replay path from its first call, whatever the timing."""
    monkeypatch.setenv("OPGATE_REPLAY_BUILD", "wait")
    fresh["gate"].set()  # the build this process waits for
    assert replay.attach("ns::op", lambda: None) is True
    assert fresh["lib"].registered == ["ns::op"]
    assert replay._STATE.get("thread") is None  # nothing left to a background thread


def test_build_mode_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPGATE_REPLAY_BUILD", raising=False)
    assert replay.build_waits() is False
    monkeypatch.setenv("OPGATE_REPLAY_BUILD", " Wait ")
    assert replay.build_waits() is True
    monkeypatch.setenv("OPGATE_REPLAY_BUILD", "later")
    with pytest.raises(ValueError, match="OPGATE_REPLAY_BUILD must be one of background, wait, got 'later'"):
        replay.build_waits()


def _plan_words(outputs: tuple[Any, ...]) -> list[int]:
    from array import array

    import torch

    from opgate.ops._replay.record import Recorder

    with Recorder((torch.ones(2),)) as rec:
        pass
    plan = rec.plan(outputs)
    assert plan is not None, rec.refused
    return list(array("q", plan))


def test_two_empty_outputs_get_two_buffers_not_one() -> None:
    """Empty storages all have address 0: keyed by address they became one buffer, so a replay
    returned two empty outputs as views of one storage (opcheck: outputs alias each other)."""
    import torch

    a, b = torch.empty(0, 3), torch.empty(0, 5)
    _version, buffers, launches, outputs = _plan_words((a, b))[:4]
    assert (buffers, launches, outputs) == (2, 0, 2)
    view = a.view(3, 0)  # another view of the same empty storage is the same buffer
    assert _plan_words((a, view))[1] == 1


def test_a_recording_keeps_none_of_the_calls_tensors_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under CUDA graph trees a tensor kept alive after the call is pool memory torch finds untracked
    ("Detected N tensor(s) in the cudagraph pool not tracked as outputs", N the op's inputs)."""
    import gc
    import weakref

    import torch

    monkeypatch.setattr(replay, "_IMPLS", {"ns::twice": torch.empty_like})
    replay._handle("ns::twice", (torch.ones(4),), True)  # first use imports (their garbage aside)
    x = torch.ones(4)
    seen = weakref.ref(x)
    gc.disable()  # what frees them must be the reference count, not a later collection
    try:
        outs, _plan = replay._handle("ns::twice", (x,), True)
        del x, outs
        assert seen() is None, "the recording still holds the call's input"
    finally:
        gc.enable()
