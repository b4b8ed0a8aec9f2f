"""The two test tiers, and the guard that keeps a unit test a unit test.

* ``integration``: a test that starts a process (a worker pool, the ``opgate``
  CLI, nox, a compiler, a browser) or compiles with ``torch.compile`` /
  ``torch.export`` / AOTInductor.  Marked where it is written:
  ``pytestmark = pytest.mark.integration`` for a whole module, the decorator for
  one test.  ``slow`` and ``browser`` tests are integration tests too.
* ``unit``: every other test; :func:`pytest_collection_modifyitems` adds the mark,
  so ``-m unit`` and ``-m integration`` each select a real, non-empty set and
  together select everything.

A unit test runs under a guard (set up before its fixtures, so a module
fixture that starts a process counts too): starting a process or compiling
fails it with the line to add.  The split therefore cannot drift: a test that
became an integration test says so the first time it runs as a unit test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

INTEGRATION_MARKS = ("integration", "slow", "browser")


class CrossedTheUnitBoundary(AssertionError):
    """A test marked (by default) ``unit`` started a process or compiled."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if any(item.get_closest_marker(m) for m in INTEGRATION_MARKS):
            if item.get_closest_marker("integration") is None:
                item.add_marker(pytest.mark.integration)
        else:
            item.add_marker(pytest.mark.unit)


def _refuser(item: pytest.Item, what: str) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise CrossedTheUnitBoundary(
            f"{item.nodeid} is a unit test but {what}: mark it an integration test "
            "(`pytestmark = pytest.mark.integration` for its module, `@pytest.mark.integration` for it)"
        )

    return refuse


@contextmanager
def _guard(item: pytest.Item) -> Iterator[None]:
    """Processes and compilers refused while ``item`` sets up and runs."""
    patches: list[tuple[Any, str, Any]] = [
        (subprocess.Popen, "__init__", _refuser(item, "starts a process (subprocess)")),
        (os, "fork", _refuser(item, "forks")),
        (os, "posix_spawn", _refuser(item, "spawns a process")),
    ]
    torch = sys.modules.get("torch")
    if torch is not None:
        patches.append((torch, "compile", _refuser(item, "calls torch.compile")))
        patches.append((torch.export, "export", _refuser(item, "calls torch.export.export")))
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    for owner, name, value in patches:
        setattr(owner, name, value)
    try:
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    if item.get_closest_marker("unit") is None:
        return (yield)
    with _guard(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    if item.get_closest_marker("unit") is None:
        return (yield)
    with _guard(item):
        return (yield)
