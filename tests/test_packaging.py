"""The distribution claims one import name: every package folder is installed as ``opgate.<stage>``."""

from __future__ import annotations

from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("matrix", "validators", "ops", "reports")


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_every_package_folder_is_listed_under_opgate() -> None:
    setuptools = _pyproject()["tool"]["setuptools"]
    on_disk = {
        "opgate." + ".".join(init.parent.relative_to(ROOT).parts)
        for stage in STAGES
        for init in (ROOT / stage).rglob("__init__.py")
        if "runs" not in init.parts and "published" not in init.parts
    }
    assert on_disk == set(setuptools["packages"]), "pyproject.toml [tool.setuptools] packages"
    assert setuptools["package-dir"] == {f"opgate.{s}": s for s in STAGES}


def test_no_generic_top_level_name_is_claimed() -> None:
    assert all(name.startswith("opgate.") for name in _pyproject()["tool"]["setuptools"]["packages"])
    assert _pyproject()["project"]["scripts"] == {"opgate": "opgate.reports.cli:main"}
