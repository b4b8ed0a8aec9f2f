"""JSON Schemas of ``spec.yaml`` and the matrix file, written from the validators opgate runs.

Editors validate YAML against JSON Schema (a ``# yaml-language-server:
$schema=...`` line, or a settings entry); opgate itself validates with
:mod:`matrix.schema`, which says ``file:line`` and "did you mean".  Both come
from one definition: the files under ``matrix/schemas/`` are rendered from
``matrix.spec_schema.SPEC_SCHEMA`` and ``matrix.config.CONFIG_SCHEMA`` by
:func:`to_json_schema`, and a test fails when the committed files differ from
a fresh rendering.  Rules that span keys (an implementation's dtypes within
the op's, a ``default`` shape set, references that resolve) are opgate's
alone; an editor's schema is the first line of defence, not the last.

    python -m opgate.matrix.json_schemas          # rewrite matrix/schemas/*.json
    python -m opgate.matrix.json_schemas --check  # exit 1 when they are stale
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from opgate.matrix.schema import Bool, Enum, Float, Int, ListOf, MapOf, Record, Schema, Str

SCHEMAS_DIR = Path(__file__).resolve().parent / "schemas"
DRAFT = "https://json-schema.org/draft/2020-12/schema"


def _record(schema: Record) -> dict[str, Any]:
    required = [name for name, f in schema.fields.items() if f.required]
    return {
        "type": "object",
        "description": schema.what,
        "properties": {name: to_json_schema(f.schema) for name, f in schema.fields.items()},
        "additionalProperties": False,
        **({"required": required} if required else {}),
    }


def _map_of(schema: MapOf) -> dict[str, Any]:
    keys = {k: v for k, v in to_json_schema(schema.key).items() if k != "description"}
    return {
        "type": "object",
        "propertyNames": keys,
        "additionalProperties": to_json_schema(schema.value),
        **({"minProperties": schema.min_len} if schema.min_len else {}),
    }


def _list_of(schema: ListOf) -> dict[str, Any]:
    return {
        "type": "array",
        "items": to_json_schema(schema.item),
        **({"minItems": schema.min_len} if schema.min_len else {}),
        **({"uniqueItems": True} if schema.unique else {}),
    }


def _str(schema: Str) -> dict[str, Any]:
    """A pattern anchored as ``fullmatch`` is; a free string must hold a non-blank character."""
    pattern = f"^(?:{schema.pattern.pattern})$" if schema.pattern is not None else r"\S"
    return {"type": "string", "description": schema.label, "pattern": pattern}


def _int(schema: Int) -> dict[str, Any]:
    if schema.choices:
        return {"enum": list(schema.choices)}
    return {"type": "integer", **({} if schema.minimum is None else {"minimum": schema.minimum})}


def _float(schema: Float) -> dict[str, Any]:
    if schema.minimum is None:
        return {"type": "number"}
    return {"type": "number", ("exclusiveMinimum" if schema.strict else "minimum"): schema.minimum}


_RENDER: dict[type, Callable[[Any], dict[str, Any]]] = {
    Record: _record,
    MapOf: _map_of,
    ListOf: _list_of,
    Enum: lambda s: {"enum": list(s.values), "description": s.what},
    Str: _str,
    Int: _int,
    Float: _float,
    Bool: lambda _: {"type": "boolean"},
}


def to_json_schema(schema: Schema) -> dict[str, Any]:
    """One validator as JSON Schema (draft 2020-12); subclasses (``Glob``) render as their base."""
    for cls in type(schema).__mro__:
        if cls in _RENDER:
            return _RENDER[cls](schema)
    raise TypeError(f"no JSON Schema for {type(schema).__name__}")


def documents() -> dict[str, dict[str, Any]]:
    """File name -> JSON Schema document, for every published schema."""
    from opgate.matrix.config import CONFIG_SCHEMA
    from opgate.matrix.spec_schema import SPEC_SCHEMA

    titles = {
        "spec.schema.json": ("opgate op spec (spec.yaml)", SPEC_SCHEMA, "ops/SPEC.md"),
        "matrix.schema.json": ("opgate matrix file (matrix/default.yaml)", CONFIG_SCHEMA, "README.md"),
    }
    return {
        name: {
            "$schema": DRAFT,
            "title": title,
            "$comment": f"Generated from opgate's validators by opgate.matrix.json_schemas; format: {doc}.",
            **to_json_schema(schema),
        }
        for name, (title, schema, doc) in titles.items()
    }


def render(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m opgate.matrix.json_schemas", description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 when a committed schema is stale")
    args = parser.parse_args(argv)
    stale = []
    for name, document in documents().items():
        path = SCHEMAS_DIR / name
        text = render(document)
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        stale.append(str(path))
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    if stale:
        verb = "stale" if args.check else "written"
        print(f"{verb}: {', '.join(stale)}", file=sys.stderr)
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
