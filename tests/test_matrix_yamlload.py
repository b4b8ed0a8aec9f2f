"""YAML loading: safe only, lines kept, duplicate keys and YAML 1.1 booleans refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from opgate.matrix.errors import ConfigError, ConfigErrors
from opgate.matrix.yamlload import YMap, YScalar, YSeq, load_yaml, parse_yaml, plain


def errors_of(text: str) -> list[ConfigError]:
    with pytest.raises(ConfigError) as info:
        parse_yaml(text, "f.yaml")
    err = info.value
    return err.errors if isinstance(err, ConfigErrors) else [err]


def test_lines_are_kept_for_keys_values_and_items() -> None:
    tree = parse_yaml("# c\na: 1\nb:\n  - u\n  - v\nc: {d: true}\n", "f.yaml")
    assert isinstance(tree, YMap)
    assert [(k.value, k.where.line) for k, _ in tree] == [("a", 2), ("b", 3), ("c", 6)]
    b = tree.get("b")
    assert isinstance(b, YSeq)
    assert [(i.value, i.where.line) for i in b.items if isinstance(i, YScalar)] == [("u", 4), ("v", 5)]
    assert str(b.items[1].where) == "f.yaml:5"
    assert plain(tree) == {"a": 1, "b": ["u", "v"], "c": {"d": True}}


def test_duplicate_key_names_both_lines() -> None:
    (err,) = errors_of("dtype: [fp32]\nmode: [eager]\ndtype: [bf16]\n")
    assert err.where is not None
    assert (err.where.path, err.where.line) == ("f.yaml", 3)
    assert "duplicate key 'dtype'" in err.problem
    assert err.hint is not None
    assert "line 1" in err.hint


def test_duplicate_key_in_nested_mapping() -> None:
    (err,) = errors_of("runners:\n  cpu: [a]\n  cpu: [b]\n")
    assert err.where is not None
    assert err.where.line == 3


@pytest.mark.parametrize(
    "word", ["yes", "no", "on", "off", "y", "n", "Yes", "NO", "On", "OFF", "Y", "N", "yEs"]
)
def test_yaml11_boolean_values_are_rejected(word: str) -> None:
    (err,) = errors_of(f"a: 1\nptx: {word}\n")
    assert err.where is not None
    assert err.where.line == 2
    assert "YAML 1.1 boolean" in err.problem
    assert err.hint == f'use true/false, or quote it: "{word}"'


@pytest.mark.parametrize("word", ["on", "no", "Off", "y"])
def test_yaml11_boolean_keys_are_rejected(word: str) -> None:
    (err,) = errors_of(f"a: 1\n{word}: [push]\n")
    assert err.where is not None
    assert err.where.line == 2
    assert err.problem == f"key {word!r} is a YAML 1.1 boolean"
    assert err.hint == f'quote it: "{word}"'


def test_yaml11_booleans_inside_lists_are_rejected() -> None:
    (err,) = errors_of("mode:\n  - eager\n  - off\n")
    assert err.where is not None
    assert err.where.line == 3


def test_quoted_words_and_true_false_are_fine() -> None:
    tree = parse_yaml('"on": [push]\na: "no"\nb: \'off\'\nc: true\nd: false\ne: TRUE\n', "f.yaml")
    assert plain(tree) == {"on": ["push"], "a": "no", "b": "off", "c": True, "d": False, "e": True}


def test_yaml12_floats_and_unquoted_versions() -> None:
    tree = parse_yaml("a: 1e-5\nb: 1.0e-5\nc: 12.10\nd: '12.10'\ne: 2024-01-01\n", "f.yaml")
    assert plain(tree) == {"a": 1e-5, "b": 1e-5, "c": 12.1, "d": "12.10", "e": "2024-01-01"}
    assert isinstance(tree, YMap)
    c = tree.get("c")
    assert isinstance(c, YScalar)
    assert c.raw == "12.10"


def test_unsafe_tags_are_refused_and_nothing_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    text = f'a: !!python/object/apply:os.system ["touch {marker}"]\nb: !custom x\n'
    errs = errors_of(text)
    assert [e.where.line for e in errs if e.where] == [1, 2]
    assert all("not allowed" in e.problem for e in errs)
    assert not marker.exists()


def test_merge_keys_are_refused() -> None:
    (err,) = errors_of("base: &b {k: 1}\nother:\n  <<: *b\n  j: 2\n")
    assert err.where is not None
    assert err.where.line == 3
    assert "merge keys" in err.problem


def test_all_problems_of_a_file_are_reported_together() -> None:
    errs = errors_of("a: on\nb: 1\nb: 2\nc: [yes]\n")
    assert [e.where.line for e in errs if e.where] == [1, 3, 4]


def test_syntax_error_has_a_line() -> None:
    (err,) = errors_of("a: [1, 2\nb: 3\n")
    assert err.where is not None
    assert err.where.line >= 2
    assert err.problem.startswith("YAML syntax")


def test_empty_file_and_missing_file(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing\n")
    with pytest.raises(ConfigError, match="empty"):
        load_yaml(empty)
    with pytest.raises(ConfigError, match="cannot read"):
        load_yaml(tmp_path / "absent.yaml")


def test_multiple_documents_are_refused() -> None:
    (err,) = errors_of("a: 1\n---\nb: 2\n")
    assert err.where is not None
    assert err.where.line == 2


def test_recursive_alias_is_an_error_not_a_hang() -> None:
    (err,) = errors_of("a: &x [1, *x]\n")
    assert "recursive" in err.problem
