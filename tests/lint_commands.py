"""``noxfile.LINT_COMMANDS`` read as data (an :mod:`ast` literal), without importing noxfile.

Importing noxfile would register its nox sessions a second time in the test
process; the commands are a plain literal, so reading them is enough.
"""

from __future__ import annotations

import ast
from pathlib import Path

NOXFILE = Path(__file__).resolve().parents[1] / "noxfile.py"


def lint_commands() -> list[tuple[str, ...]]:
    """Every command ``nox -s lint`` runs, in order."""
    tree = ast.parse(NOXFILE.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "LINT_COMMANDS":
            assert node.value is not None
            return [tuple(c) for c in ast.literal_eval(node.value)]
    raise AssertionError(f"{NOXFILE}: no LINT_COMMANDS literal")


def lint_command(tool: str) -> list[str]:
    """The one lint command that runs ``tool``."""
    return next(list(c) for c in lint_commands() if c[0] == tool)
