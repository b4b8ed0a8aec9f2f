"""The published JSON Schemas are opgate's own validators written out, and agree with them."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from opgate.matrix import json_schemas
from opgate.matrix.config import load_config
from opgate.matrix.errors import ConfigError
from opgate.matrix.yamlload import load_yaml, plain

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "tests" / "data" / "config"
SPECS = sorted(p for d in ("ops", "tests") for p in (ROOT / d).rglob("spec.yaml"))
MATRICES = [ROOT / "matrix" / "default.yaml", CONFIGS / "small.yaml", CONFIGS / "two_ops.yaml"]


def _validator(name: str) -> jsonschema.Draft202012Validator:
    document = json.loads((json_schemas.SCHEMAS_DIR / name).read_text())
    jsonschema.Draft202012Validator.check_schema(document)
    return jsonschema.Draft202012Validator(document)


def test_committed_schemas_are_the_validators_rendered() -> None:
    for name, document in json_schemas.documents().items():
        committed = (json_schemas.SCHEMAS_DIR / name).read_text()
        assert committed == json_schemas.render(document), (
            f"matrix/schemas/{name} is stale: run python -m opgate.matrix.json_schemas"
        )
    assert json_schemas.main(["--check"]) == 0


@pytest.mark.parametrize("path", SPECS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_spec_in_the_repository_passes_the_editor_schema(path: Path) -> None:
    errors = [e.message for e in _validator("spec.schema.json").iter_errors(plain(load_yaml(path)))]
    assert errors == []


@pytest.mark.parametrize("path", MATRICES, ids=lambda p: p.name)
def test_good_matrix_files_pass_the_editor_schema(path: Path) -> None:
    load_config(path)
    assert [e.message for e in _validator("matrix.schema.json").iter_errors(plain(load_yaml(path)))] == []


#: Bad matrix files and whether the schema alone sees the mistake (the rest are cross-key rules).
BAD_MATRICES = {
    "bad_enum.yaml": True,
    "bad_glob.yaml": True,
    "bad_many.yaml": True,
    "bad_override.yaml": True,
    "bad_unknown_key.yaml": True,
    "bad_wrong_type.yaml": True,
    "bad_no_cuda.yaml": False,
}


@pytest.mark.parametrize(("name", "schema_sees_it"), sorted(BAD_MATRICES.items()))
def test_bad_matrix_files_fail_both(name: str, *, schema_sees_it: bool) -> None:
    path = CONFIGS / name
    with pytest.raises(ConfigError):
        load_config(path)
    errors = list(_validator("matrix.schema.json").iter_errors(plain(load_yaml(path))))
    assert bool(errors) is schema_sees_it, [e.message for e in errors]


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("dtypes: [fp32, fp16, bf16]", "dtpyes: [fp32, fp16, bf16]"),  # unknown key
        ("category: norm", "category: nrom"),  # enum
        ("k: 2.0", "k: -1"),  # exclusive minimum
        ("kind: triton", "kind: trton"),
        ("op: rms_norm", "op: Rms-Norm"),  # pattern
        ("dynamic_shapes: true", "dynamic_shapes: 1"),  # type
    ],
)
def test_spec_mistakes_fail_the_editor_schema(tmp_path: Path, old: str, new: str) -> None:
    text = (ROOT / "ops" / "rms_norm" / "spec.yaml").read_text()
    assert old in text
    bad = tmp_path / "spec.yaml"
    bad.write_text(text.replace(old, new, 1))
    assert list(_validator("spec.schema.json").iter_errors(plain(load_yaml(bad))))
