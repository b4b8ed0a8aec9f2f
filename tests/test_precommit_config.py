"""The pre-commit hooks run what ``nox -s lint`` runs: the same tools, the same arguments.

``noxfile.LINT_COMMANDS`` is the list; each must be the ``entry`` of one local
hook in .pre-commit-config.yaml (mypy's wrapped in the link that makes
``opgate`` importable, as the lint session's ``MYPYPATH`` does).  A command
added to one and not the other turns this red.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import yaml

from tests.lint_commands import lint_commands

ROOT = Path(__file__).resolve().parents[1]


def hooks() -> list[dict[str, object]]:
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text(encoding="utf-8"))
    return [hook for repo in config["repos"] if repo["repo"] == "local" for hook in repo["hooks"]]


def hook_command(hook: dict[str, object]) -> tuple[str, ...]:
    """The tool command a hook runs: its entry, or the last command of an ``sh -c`` wrapper."""
    argv = shlex.split(str(hook["entry"]))
    if argv[:2] == ["sh", "-c"]:
        argv = shlex.split(argv[2].split("&&")[-1])
        argv = [a for a in argv if "=" not in a.split("/")[0]]  # drop VAR=value prefixes
    return (*argv, *map(str, hook.get("args", []) or []))  # type: ignore[call-overload]


def test_every_lint_command_is_a_hook_and_every_hook_a_lint_command() -> None:
    assert sorted(hook_command(h) for h in hooks()) == sorted(lint_commands())


def test_hooks_check_the_whole_tree_like_the_session() -> None:
    for hook in hooks():
        assert hook["language"] == "system", hook["id"]
        assert hook["pass_filenames"] is False, (
            f"{hook['id']}: the session checks every file, not the staged ones"
        )


def test_mypy_hook_reads_opgate_from_the_checkout_link() -> None:
    mypy = next(h for h in hooks() if h["id"] == "mypy")
    assert "MYPYPATH=.nox/_checkout" in str(mypy["entry"])
    assert 'ln -sfn "$PWD" .nox/_checkout/opgate' in str(mypy["entry"])
