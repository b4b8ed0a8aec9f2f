"""``module:attribute`` references resolved at spec validation, statically (nothing is imported)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from opgate.matrix.errors import ConfigError, ConfigErrors
from opgate.matrix.spec import load_specs
from opgate.matrix.spec_refs import check_reference, import_root

SPEC = """\
spec_version: 1
op: my_op
summary: "x * y"
category: other
reference: {reference}
samples: ops.my_op.reference:sample_inputs
shapes:
  default: [[4, 8]]
dtypes: [fp32]
layouts: [contiguous]
modes: [eager]
tolerance: {{k: 2.0, atol_floor: 1.0e-5}}
implementations:
  triton:
    kind: triton
    module: {module}
    entry: {entry}
    qualname: team::my_op
    evidence:
      cpu: {{expect: ["team::my_op"]}}
      cuda: {{expect: ["_my_op_kernel*"]}}
"""
GOOD = {
    "reference": "ops.my_op.reference:my_op",
    "module": "ops.my_op.triton_impl",
    "entry": "ops.my_op.triton_impl:my_op",
}


def _repo(tmp_path: Path, **refs: str) -> Path:
    """A team's repository: a package named ``ops`` holding one op folder."""
    op = tmp_path / "ops" / "my_op"
    op.mkdir(parents=True)
    (tmp_path / "ops" / "__init__.py").write_text("")
    (op / "__init__.py").write_text("")
    (op / "reference.py").write_text(
        "import torch\n\ndef my_op(x, y):\n    return x * y\n\n"
        "def sample_inputs(*a):\n    raise NotImplementedError\n"
    )
    (op / "triton_impl.py").write_text(
        "try:\n    import triton\nexcept ImportError:\n    triton = None\n\n"
        "@decorated('team::my_op')\ndef my_op(x, y):\n    return x * y\n\nKERNELS: dict = {}\n"
    )
    (op / "spec.yaml").write_text(SPEC.format(**{**GOOD, **refs}))
    return tmp_path


def _errors(repo: Path) -> list[ConfigError]:
    with pytest.raises(ConfigError) as info:
        load_specs([repo / "ops"])
    return info.value.errors if isinstance(info.value, ConfigErrors) else [info.value]


def test_a_package_named_ops_validates_from_the_folder_above_it(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    assert import_root(repo / "ops") == repo.resolve()
    assert import_root(repo / "ops" / "my_op") == repo.resolve()
    spec = load_specs([repo / "ops"])["my_op"]
    assert spec.root == repo.resolve()
    assert spec.implementations["triton"].requires == ["triton"]  # a Triton kernel needs triton


@pytest.mark.parametrize(
    ("key", "ref", "line", "problem"),
    [
        ("reference", "ops.my_op.referenc:my_op", 5, "no module 'ops.my_op.referenc'; did you mean"),
        ("module", "ops.myop.triton_impl", 16, "no module 'ops.myop'; did you mean 'my_op'?"),
        ("entry", "ops.my_op.triton_impl:my_opp", 17, "defines no 'my_opp'; did you mean 'my_op'?"),
        ("entry", "opz.my_op.triton_impl:my_op", 17, "no module 'opz' (not under"),
        ("entry", "ops.my_op.reference.inner:my_op", 17, "is a module, not a package"),
    ],
)
def test_a_typo_is_a_spec_error_with_file_line(
    tmp_path: Path, key: str, ref: str, line: int, problem: str
) -> None:
    repo = _repo(tmp_path, **{key: ref})
    (err,) = _errors(repo)
    assert err.where is not None
    assert (err.where.path, err.where.line) == (str(repo / "ops" / "my_op" / "spec.yaml"), line)
    assert problem in err.problem, err.problem
    assert err.exit_code == 3


@pytest.mark.integration
def test_cli_refuses_a_typo_before_any_cell_runs(tmp_path: Path) -> None:
    repo = _repo(tmp_path, entry="ops.my_op.triton_impl:my_opp")
    out = tmp_path / "out"
    for argv in (["list"], ["run", "--out", str(out), "--no-progress"]):
        proc = subprocess.run(
            [sys.executable, "-m", "opgate.reports.cli", *argv, "--ops-path", "ops", "--select", "my_op.*"],
            cwd=repo,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 3, proc.stderr
        assert f"{repo / 'ops' / 'my_op' / 'spec.yaml'}:17: implementations.triton.entry:" in proc.stderr
        assert "Traceback" not in proc.stderr
    assert not out.exists()  # refused before any output


def test_what_cannot_be_decided_statically_is_accepted(tmp_path: Path) -> None:
    (tmp_path / "lazy.py").write_text("def __getattr__(name):\n    return name\n")
    (tmp_path / "star.py").write_text("from os.path import *\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "sub.py").write_text("")
    for ref in ("lazy:anything", "star:join", "pkg:sub", "os.path:join", "json:dumps.__doc__"):
        assert check_reference(ref, [tmp_path]) is None, ref
    assert "defines no 'nope'" in (check_reference("json:nope", [tmp_path]) or "")
    (tmp_path / "local.py").write_text("def f():\n    g = 1\n")
    assert "defines no 'g'" in (check_reference("local:g", [tmp_path]) or "")  # local to f


def test_a_required_distribution_may_be_absent(tmp_path: Path) -> None:
    absent = "opgate_absent_dist.mod:fn"
    assert check_reference(absent, [tmp_path], optional=True) is None
    assert "no module 'opgate_absent_dist'" in (check_reference(absent, [tmp_path]) or "")
    # a typo inside a package that *is* here is still caught
    assert check_reference("json.nope:fn", [tmp_path], optional=True) is not None
