"""``--changed-since REF``: the ops a git diff can affect, through their imports; all on harness changes.

Each test builds a real git repository holding copies of the runner's planted
ops (``tests/fixtures_runner``: three ops sharing ``fx_common.py``), changes
files the way a pull request would, and asks ``opgate list|plan|run`` which
cells remain.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from opgate.matrix.changes import Changes, affected_by, changed_files
from opgate.matrix.errors import ConfigError, UsageError
from opgate.matrix.sources import OPGATE_DIR
from opgate.matrix.spec import load_specs

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).parent / "fixtures_runner"
ROOT = Path(__file__).resolve().parent.parent


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t"}
    env["GIT_COMMITTER_EMAIL"] = "t@t"
    out = subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A checkout whose ``ops/`` holds the planted ops, committed on ``main``."""
    repo = tmp_path / "repo"
    shutil.copytree(FIXTURES, repo / "ops", ignore=shutil.ignore_patterns("__pycache__", "fake_worker.py"))
    (repo / "README.md").write_text("my ops\n")
    config = repo / "ops" / "matrix.yaml"
    config.write_text(
        config.read_text() + "runners:\n  cpu: [ubuntu-latest]\n  sm_90: [self-hosted, gpu-sm90]\n"
    )
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "ops")
    return repo


def affected(repo: Path, ref: str = "main") -> tuple[list[Path], dict[str, list[str]]]:
    specs = load_specs([repo / "ops"])
    found = affected_by(changed_files(ref, repo), specs, repo / "ops" / "matrix.yaml")
    rel = {op: sorted(str(p.relative_to(repo)) for p in files) for op, files in found.ops.items()}
    return found.everything, rel


def test_a_change_to_one_op_affects_that_op_only(repo: Path) -> None:
    impl = repo / "ops" / "fx_segv" / "impl.py"
    impl.write_text(impl.read_text() + "\n# a fix\n")  # unstaged
    assert affected(repo) == ([], {"fx_segv": ["ops/fx_segv/impl.py"]})
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "fix")
    assert affected(repo, "HEAD~1") == ([], {"fx_segv": ["ops/fx_segv/impl.py"]})
    assert affected(repo, "HEAD") == ([], {})


def test_a_shared_helper_affects_every_op_importing_it_even_deleted(repo: Path) -> None:
    specs = load_specs([repo / "ops"])
    importers = sorted(n for n, s in specs.items() if s.reference.startswith("fx_common:"))
    assert {"fx_flaky", "fx_hang", "fx_segv"} <= set(importers)
    common = repo / "ops" / "fx_common.py"
    common.write_text(common.read_text() + "\n# shared helper edited\n")
    _, ops = affected(repo)
    assert sorted(ops) == importers
    git(repo, "checkout", "--", "ops/fx_common.py")
    helper = repo / "ops" / "fx_helper.py"  # imported by one op's implementation only
    helper.write_text("FACTOR = 2\n")
    impl = repo / "ops" / "fx_segv" / "impl.py"
    impl.write_text(impl.read_text() + "\nimport fx_helper  # noqa: E402\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "a helper")
    helper.unlink()  # an op that imports a deleted module is affected too
    assert affected(repo, "HEAD") == ([], {"fx_segv": ["ops/fx_helper.py"]})


def test_a_change_to_the_package_an_op_module_lives_in_affects_the_op(repo: Path) -> None:
    """Importing ``fx_segv.impl`` runs ``fx_segv/__init__.py`` first: a break there breaks the op's
    cells, so it counts (for the verdict cache too), though no import statement names it."""
    init = repo / "ops" / "fx_segv" / "__init__.py"
    init.write_text(init.read_text() + 'raise RuntimeError("broken package")\n')
    assert affected(repo) == ([], {"fx_segv": ["ops/fx_segv/__init__.py"]})
    git(repo, "checkout", "--", "ops/fx_segv/__init__.py")
    init.unlink()  # a namespace package now: still the op's
    assert affected(repo) == ([], {"fx_segv": ["ops/fx_segv/__init__.py"]})


def test_a_module_named_as_a_string_to_import_module_counts(repo: Path) -> None:
    """``importlib.import_module("fx_plugin")`` imports as surely as an import statement: the module
    counts for the op (and its verdict-cache digest); a name built at run time names nothing."""
    from opgate.matrix.sources import op_source_files

    (repo / "ops" / "fx_plugin.py").write_text("SCALE = 1\n")
    (repo / "ops" / "fx_dynamic.py").write_text("SCALE = 1\n")
    impl = repo / "ops" / "fx_segv" / "impl.py"
    impl.write_text(
        impl.read_text()
        + "\nimport importlib  # noqa: E402\n\n\ndef _plugin(name: str = 'dynamic') -> object:\n"
        + "    importlib.import_module(f'fx_{name}')\n    return importlib.import_module('fx_plugin')\n"
    )
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "a plugin")
    spec = load_specs([repo / "ops"])["fx_segv"]
    files = {p.name for p in op_source_files(spec)}
    assert "fx_plugin.py" in files
    assert "fx_dynamic.py" not in files
    (repo / "ops" / "fx_plugin.py").write_text("SCALE = 2\n")
    (repo / "ops" / "fx_dynamic.py").write_text("SCALE = 2\n")
    assert affected(repo, "HEAD") == ([], {"fx_segv": ["ops/fx_plugin.py"]})


def test_data_files_the_spec_names_count_added_and_deleted_ones_too(repo: Path) -> None:
    """A table the op reads at run time is no import: named under ``data``, it is in the op's digest
    files and a change to it (a new file under the glob, a deleted one) selects the op; others do not."""
    from opgate.matrix.sources import op_source_files

    op_dir = repo / "ops" / "fx_segv"
    (op_dir / "tables" / "more").mkdir(parents=True)
    (op_dir / "tables" / "scale.json").write_text('{"scale": 1}\n')
    (op_dir / "tables" / "more" / "bias.json").write_text('{"bias": 0}\n')
    (op_dir / "blob.bin").write_bytes(b"\x00\x01")
    (op_dir / "notes.txt").write_text("not data\n")
    spec = op_dir / "spec.yaml"
    spec.write_text(spec.read_text() + "data: [tables, 'blob.*']\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "data files")
    mine = op_dir.resolve()
    spec_files = op_source_files(load_specs([repo / "ops"])["fx_segv"])
    files = {str(p.relative_to(mine)) for p in spec_files if mine in p.parents}
    assert {"tables/scale.json", "tables/more/bias.json", "blob.bin"} <= files
    assert "notes.txt" not in files
    (op_dir / "notes.txt").write_text("still not data\n")
    assert affected(repo, "HEAD") == ([], {})
    (op_dir / "tables" / "more" / "bias.json").write_text('{"bias": 1}\n')
    assert affected(repo, "HEAD") == ([], {"fx_segv": ["ops/fx_segv/tables/more/bias.json"]})
    git(repo, "checkout", "--", ".")
    (op_dir / "tables" / "new.json").write_text("{}\n")  # a new file under the glob, untracked
    assert affected(repo, "HEAD") == ([], {"fx_segv": ["ops/fx_segv/tables/new.json"]})
    (op_dir / "tables" / "new.json").unlink()
    (op_dir / "tables" / "scale.json").unlink()  # deleted: no longer on disk, still the op's
    assert affected(repo, "HEAD") == ([], {"fx_segv": ["ops/fx_segv/tables/scale.json"]})
    git(repo, "checkout", "--", ".")
    (op_dir / "blob.bin").write_bytes(b"\x02")
    assert affected(repo, "HEAD") == ([], {"fx_segv": ["ops/fx_segv/blob.bin"]})


@pytest.mark.parametrize(
    ("rel", "pattern", "covered"),
    [
        ("tables/a.json", "tables/**/*.json", True),  # ** matches no folder too, as Path.glob's
        ("tables/x/y/a.json", "tables/**/*.json", True),
        ("tables/x/a.json", "tables", True),  # a folder counts its files
        ("tables.json", "tables", False),
        ("../shared/lut.bin", "../shared/*.bin", True),
        ("tables/a.txt", "tables/*.json", False),
    ],
)
def test_data_globs_cover_files_that_no_longer_exist(
    tmp_path: Path, rel: str, pattern: str, covered: bool
) -> None:
    from opgate.matrix.sources import Closure

    base = (tmp_path / "ops" / "myop").resolve()
    closure = Closure(data=[(base, pattern)])
    assert closure.covers((base / rel).resolve()) is covered


def test_a_data_glob_that_matches_nothing_is_a_spec_error_with_its_line(repo: Path) -> None:
    spec = repo / "ops" / "fx_segv" / "spec.yaml"
    spec.write_text(spec.read_text() + "data: [tabels/*.json]\n")
    line = len(spec.read_text().splitlines())
    with pytest.raises(ConfigError) as err:
        load_specs([repo / "ops"])
    assert f"spec.yaml:{line}" in str(err.value)
    assert "data: 'tabels/*.json' matches no file next to the spec" in str(err.value)


def test_a_header_a_cuda_source_includes_from_a_subfolder_counts(tmp_path: Path) -> None:
    """``#include "detail/math.h"``: the header is in the op's sources, so a change to it selects the
    op and changes its verdict-cache digest and its build key; a header nothing includes does not."""
    from opgate.matrix.sources import cuda_dependencies
    from opgate.validators.cuda_build import source_hash

    folder = tmp_path / "myop" / "cuda"
    (folder / "detail" / "more").mkdir(parents=True)
    kernel = folder / "kernel.cu"
    kernel.write_text('#include "detail/math.h"\n#include <cuda_runtime.h>\n__global__ void k() {}\n')
    (folder / "detail" / "math.h").write_text('#pragma once\n#include "more/deeper.cuh"\n')
    (folder / "detail" / "more" / "deeper.cuh").write_text("#pragma once\n")
    (folder / "detail" / "unused.h").write_text("#pragma once\n")
    files, watched = cuda_dependencies([kernel])
    mine = sorted(str(p.relative_to(tmp_path)) for p in files if tmp_path in p.parents)
    assert mine == ["myop/cuda/detail/math.h", "myop/cuda/detail/more/deeper.cuh", "myop/cuda/kernel.cu"]
    assert (folder / "detail" / "math.h").resolve() in watched
    before = source_hash([kernel])
    (folder / "detail" / "more" / "deeper.cuh").write_text("#pragma once\n#define SCALE 2\n")
    assert source_hash([kernel]) != before  # a stale build is not reused
    after = source_hash([kernel])
    (folder / "detail" / "unused.h").write_text("#pragma once\n#define UNUSED 1\n")
    assert source_hash([kernel]) == after


def test_new_untracked_and_unrelated_files(repo: Path) -> None:
    (repo / "docs.md").write_text("unrelated\n")
    (repo / "ops" / "fx_segv" / "selftest.py").write_text("print('nothing imports me')\n")
    assert affected(repo) == ([], {})
    spec = repo / "ops" / "fx_new" / "spec.yaml"  # a new op, not yet added to git
    spec.parent.mkdir()
    shutil.copy(repo / "ops" / "fx_segv" / "spec.yaml", spec)
    spec.write_text(spec.read_text().replace("op: fx_segv", "op: fx_new"))
    assert affected(repo)[1] == {"fx_new": ["ops/fx_new/spec.yaml"]}


def test_base_branch_changes_after_the_branch_point_do_not_count(repo: Path) -> None:
    git(repo, "checkout", "-q", "-b", "feature")
    for op, note in (("fx_hang", "# feature work\n"), ("fx_flaky", "# main moved on\n")):
        if op == "fx_flaky":
            git(repo, "commit", "-qam", "feature")
            git(repo, "checkout", "-q", "main")
        impl = repo / "ops" / op / "impl.py"
        impl.write_text(impl.read_text() + note)
    git(repo, "commit", "-qam", "main")
    git(repo, "checkout", "-q", "feature")
    assert affected(repo, "main")[1] == {"fx_hang": ["ops/fx_hang/impl.py"]}


def test_harness_code_or_the_config_in_use_affects_everything(repo: Path) -> None:
    specs = load_specs([repo / "ops"])
    config = repo / "ops" / "matrix.yaml"
    for path in (
        OPGATE_DIR / "validators" / "pool.py",
        OPGATE_DIR / "validators" / "checks" / "correctness.py",
        OPGATE_DIR / "matrix" / "spec.py",  # the spec loader
        OPGATE_DIR / "ops" / "_extension.py",  # payload-side, reached from the harness's imports
        config,
    ):
        found = affected_by(Changes("main", "0" * 40, repo, frozenset({path.resolve()})), specs, config)
        assert found.everything == [path.resolve()], path
        assert "every cell runs: harness code or matrix config changed" in found.describe()
    other_config = OPGATE_DIR / "matrix" / "default.yaml"  # a config this run does not use
    found = affected_by(Changes("main", "0" * 40, repo, frozenset({other_config})), specs, config)
    assert found.everything == []
    reports = OPGATE_DIR / "reports" / "diff.py"  # downstream of every verdict
    assert affected_by(Changes("main", "0" * 40, repo, frozenset({reports})), specs, config).everything == []


def test_errors_are_one_line_with_their_exit_codes(repo: Path, tmp_path: Path) -> None:
    base = ["--ops-path", str(repo / "ops"), "--config", str(repo / "ops" / "matrix.yaml")]
    with pytest.raises(UsageError, match="not a commit"):
        changed_files("no-such-branch", repo)
    bare = tmp_path / "not-a-checkout"
    bare.mkdir()
    with pytest.raises(ConfigError, match="is not in a git checkout"):
        changed_files("main", bare)
    for cwd, ref, code, text in (
        (repo, "nope", 2, "not a commit"),
        (bare, "main", 3, "not in a git checkout"),
    ):
        proc = opgate(cwd, "list", *base, "--changed-since", ref)
        assert proc.returncode == code, proc.stderr
        assert text in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
        assert "Traceback" not in proc.stderr


def opgate(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "opgate.reports.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_list_plan_and_run_keep_only_the_affected_cells(repo: Path, tmp_path: Path) -> None:
    base = ["--ops-path", str(repo / "ops"), "--config", str(repo / "ops" / "matrix.yaml")]
    (repo / "ops" / "fx_segv" / "impl.py").write_text(
        (repo / "ops" / "fx_segv" / "impl.py").read_text() + "\n# fix\n"
    )
    listed = opgate(repo, "list", *base, "--changed-since", "main")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split()
    assert all(i.startswith("fx_segv.") for i in listed.stdout.split())
    assert "ops affected: fx_segv (ops/fx_segv/impl.py)" in listed.stderr
    plan = opgate(repo, "plan", *base, "--format", "json", "--changed-since", "main")
    assert plan.returncode == 0, plan.stderr
    assert {s["name"].split("-")[0] for s in json.loads(plan.stdout)["include"]} == {"cpu", "sm_90"}
    git(repo, "commit", "-qam", "fix")
    nothing = opgate(repo, "plan", *base, "--changed-since", "HEAD")
    assert nothing.returncode == 0
    assert json.loads(nothing.stdout) == {"include": []}
    assert "none can change a verdict" in nothing.stderr
    out = tmp_path / "out"
    run = opgate(repo, "run", *base, "--changed-since", "HEAD", "--out", str(out), "--no-progress")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "none can change a verdict" in run.stdout
    assert json.loads((out / "results.json").read_text())["cells"] == []
    record = json.loads((out / "run.json").read_text())
    assert record["workers"] == []  # nothing started: no worker, no fork server
    assert record["fork_server_preload_s"] == {}
