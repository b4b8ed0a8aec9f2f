"""Matrix config validation: every error class says file:line, and one run shows them all."""

from __future__ import annotations

from pathlib import Path

import pytest

from opgate.matrix.config import DEFAULT_CONFIG, MatrixConfig, load_config
from opgate.matrix.errors import ConfigError, ConfigErrors
from opgate.matrix.expand import expand
from opgate.matrix.spec import OpSpec, load_spec

DATA = Path(__file__).parent / "data" / "config"
OPS = DATA / "ops"


def toy_specs() -> dict[str, OpSpec]:
    return {"toy": load_spec(OPS / "toy" / "spec.yaml", OPS)}


def line_of(path: Path, marker: str, nth: int = 1) -> int:
    """1-based line of the ``nth`` line containing ``marker`` (fixtures stay editable)."""
    hits = [i for i, text in enumerate(path.read_text().splitlines(), 1) if marker in text]
    return hits[nth - 1]


def config_errors(name: str) -> list[ConfigError]:
    """Errors from loading fixture ``name`` and expanding it over the toy op."""
    path = DATA / name
    with pytest.raises(ConfigError) as info:
        expand(load_config(path), toy_specs(), "2.13.0+cpu")
    err = info.value
    assert err.exit_code == 3
    found = err.errors if isinstance(err, ConfigErrors) else [err]
    for e in found:
        assert e.where is not None
        assert e.where.path == str(path)
        assert e.message().startswith(f"{path}:{e.where.line}: ")
    return found


def test_default_config_is_valid() -> None:
    config = load_config(DEFAULT_CONFIG)
    assert isinstance(config, MatrixConfig)
    assert config.version == 1
    assert config.arch == ("cpu", "sm_80", "sm_90")
    assert config.torch == ("installed",)
    assert config.runners["sm_90"] == ("self-hosted", "linux", "x64", "gpu-sm90")
    assert config.where("runners").line == line_of(DEFAULT_CONFIG, "runners:")
    assert config.where("torch[0]").line == line_of(DEFAULT_CONFIG, "torch:")


def test_small_config_overrides_are_parsed_in_order() -> None:
    config = load_config(DATA / "small.yaml")
    assert [o.select for o in config.overrides] == ["toy.*-fp16-*", "toy.tri-*-fp16-*-compile"]
    assert config.overrides[0].get("tolerance") == {"k": 3.0}
    assert config.overrides[0].get("timeout_s") == 60.0
    assert config.overrides[1].where.line == line_of(DATA / "small.yaml", "toy.tri-*-fp16-*-compile")


def test_unknown_key_with_did_you_mean() -> None:
    errs = config_errors("bad_unknown_key.yaml")
    typo = next(e for e in errs if "unknown key" in e.problem)
    assert typo.where is not None
    assert typo.where.line == line_of(DATA / "bad_unknown_key.yaml", "dtpye")
    assert typo.hint == "did you mean 'dtype'?"
    assert any("missing required key 'dtype'" in e.problem for e in errs)


def test_wrong_types_say_expected_and_got() -> None:
    path = DATA / "bad_wrong_type.yaml"
    errs = {e.where.line: e for e in config_errors("bad_wrong_type.yaml") if e.where}
    arch = errs[line_of(path, "arch:")]
    assert "expected a list" in arch.problem
    assert "got the string 'sm_90'" in arch.problem
    assert arch.hint == "write [sm_90]"
    cuda = errs[line_of(path, "cuda:")]
    assert "got the number 12.10" in cuda.problem
    assert cuda.hint == 'quote it: "12.10"'


def test_duplicate_key() -> None:
    (err,) = config_errors("bad_duplicate_key.yaml")
    assert err.where is not None
    assert err.where.line == line_of(DATA / "bad_duplicate_key.yaml", "dtype:", nth=2)
    assert "duplicate key 'dtype'" in err.problem


def test_yaml11_booleans_as_value_and_key() -> None:
    path = DATA / "bad_yaml11_bool.yaml"
    errs = config_errors("bad_yaml11_bool.yaml")
    assert [(e.where.line, e.hint) for e in errs if e.where] == [
        (line_of(path, "off]"), 'use true/false, or quote it: "off"'),
        (line_of(path, "on: [push]"), 'quote it: "on"'),
    ]


def test_yaml11_no() -> None:
    (err,) = config_errors("bad_yaml11_no.yaml")
    assert err.where is not None
    assert err.where.line == line_of(DATA / "bad_yaml11_no.yaml", "layout: No")
    assert "'No' is a YAML 1.1 boolean" in err.problem


def test_bad_enum_with_did_you_mean() -> None:
    (err,) = config_errors("bad_enum.yaml")
    assert err.where is not None
    assert err.where.line == line_of(DATA / "bad_enum.yaml", "bf61")
    assert "unknown dtype 'bf61'" in err.problem
    assert err.hint == "did you mean 'bf16'?"


def test_unknown_shape_set() -> None:
    (err,) = config_errors("bad_shape_set.yaml")
    assert err.where is not None
    assert err.where.line == line_of(DATA / "bad_shape_set.yaml", "hueg")
    assert "'hueg'" in err.problem
    assert err.hint is not None
    assert "big, default" in err.hint


def test_ops_glob_matching_nothing() -> None:
    (err,) = config_errors("bad_ops_glob.yaml")
    assert err.where is not None
    assert err.where.line == line_of(DATA / "bad_ops_glob.yaml", "ops:")
    assert err.hint == "did you mean 'toy'?"


def test_glob_patterns_must_be_non_empty_without_spaces() -> None:
    errs = config_errors("bad_glob.yaml")
    assert [e.problem.split(":")[0] for e in errs] == ["select[0]", "select[1]"]
    assert "empty string" in errs[0].problem
    assert "not a glob pattern" in errs[1].problem


def test_override_errors() -> None:
    path = DATA / "bad_override.yaml"
    errs = config_errors("bad_override.yaml")
    assert [e.where.line for e in errs if e.where] == [line_of(path, '"toy.*"'), line_of(path, "atol:")]
    assert "sets nothing" in errs[0].problem
    assert "unknown key 'atol'" in errs[1].problem
    assert errs[1].hint is not None


def test_gpu_arch_needs_cuda() -> None:
    (err,) = config_errors("bad_no_cuda.yaml")
    assert err.where is not None
    assert err.where.line == line_of(DATA / "bad_no_cuda.yaml", "arch:")


def test_torch_versions_sharing_a_column() -> None:
    (err,) = config_errors("bad_torch_column.yaml")
    assert err.where is not None
    assert err.where.line == line_of(DATA / "bad_torch_column.yaml", "torch:")
    assert "pt2.13" in err.problem


def test_all_errors_in_one_pass() -> None:
    path = DATA / "bad_many.yaml"
    errs = config_errors("bad_many.yaml")
    assert [e.where.line for e in errs if e.where] == [
        line_of(path, "matrix_version"),
        line_of(path, "implementations"),
        line_of(path, "sm_99"),
        line_of(path, "cpu: ubuntu-latest"),
    ]
    assert errs[1].hint == 'write ["*"]'
    assert errs[2].hint == "did you mean 'sm_90'?"


def test_non_mapping_file(tmp_path: Path) -> None:
    bad = tmp_path / "list.yaml"
    bad.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match=r"list\.yaml:1: file: expected a mapping"):
        load_config(bad)
