"""The distribution claims one import name: every package folder is installed as ``opgate.<stage>``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import tomllib

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("matrix", "validators", "ops", "reports")


def _pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_every_package_folder_is_listed_under_opgate() -> None:
    setuptools = _pyproject()["tool"]["setuptools"]
    on_disk = {
        "opgate." + ".".join(init.parent.relative_to(ROOT).parts)
        for stage in STAGES
        for init in (ROOT / stage).rglob("__init__.py")
    }
    assert on_disk == set(setuptools["packages"]), "pyproject.toml [tool.setuptools] packages"
    assert setuptools["package-dir"] == {f"opgate.{s}": s for s in STAGES}


def test_no_generic_top_level_name_is_claimed() -> None:
    assert all(name.startswith("opgate.") for name in _pyproject()["tool"]["setuptools"]["packages"])
    assert _pyproject()["project"]["scripts"] == {"opgate": "opgate.reports.cli:main"}


def _module_like_strings(path: Path) -> list[str]:
    """String constants (and f-strings' literal heads) that read as a top-level stage module."""
    import ast
    import re

    pattern = re.compile(r"^(?:matrix|validators|ops|reports)\.[a-z_]+(?:\.[a-z_{}]+)*(?::\w+)?$")
    extensions = ("yaml", "yml", "json", "md", "html", "py", "xml", "txt", "cu", "cuh", "h", "css", "js")
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        text = None
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
        elif isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
            text = "".join(str(v.value) if isinstance(v, ast.Constant) else "{}" for v in node.values)
        if text and pattern.match(text) and text.rsplit(".", 1)[-1] not in extensions:
            line = getattr(node, "lineno", "?")  # expressions have one; ast.walk yields every node
            found.append(f"{path.relative_to(ROOT)}:{line}: {text!r}")
    return found


def test_no_module_is_named_by_its_checkout_path() -> None:
    """``"validators.checks.x"`` imports only where the checkout is the cwd: name ``opgate.<stage>``."""
    sources = [p for stage in STAGES for p in (ROOT / stage).rglob("*.py")]
    assert [hit for path in sources for hit in _module_like_strings(path)] == []
