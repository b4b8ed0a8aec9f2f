"""A small declarative schema over the line-annotated YAML tree.

jsonschema would validate the data, but it cannot say ``default.yaml:12`` or
suggest ``did you mean 'dtype'?``; the matrix config and every op spec need
both.  A schema here is a tree of small validators (:class:`Str`,
:class:`Enum`, :class:`ListOf`, :class:`Record`, ...).  ``validate`` walks the
YAML tree once, records *every* problem (so one run shows them all) and
returns plain Python values; callers add their own cross-field checks to the
same :class:`Problems` before raising.  The JSON Schemas published for editors
are written from these same validators (:mod:`matrix.json_schemas`).
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opgate.matrix.errors import ConfigError, ConfigErrors, Location
from opgate.matrix.yamlload import YMap, YNode, YScalar, YSeq, yaml11_boolean


class _Invalid:
    """Marker for a value that failed validation (an error is already recorded)."""

    def __repr__(self) -> str:
        return "INVALID"


INVALID: Any = _Invalid()


@dataclass
class Problems:
    """Every error found in one file, raised together."""

    errors: list[ConfigError] = field(default_factory=list)
    #: YAML 1.1 boolean words a schema took as names (ids of the scalars; see :func:`validate`)
    accepted_words: set[int] = field(default_factory=set)

    def add(self, where: Location | None, problem: str, hint: str | None = None) -> None:
        self.errors.append(ConfigError(problem, where, hint))

    def raise_if_any(self) -> None:
        if self.errors:
            raise ConfigErrors(sorted(self.errors, key=_error_order))


def _error_order(err: ConfigError) -> tuple[str, int]:
    return (err.where.path, err.where.line) if err.where else ("", 0)


def did_you_mean(value: str, choices: Sequence[str]) -> str | None:
    """``"did you mean 'bf16'?"`` for a near miss (case-insensitive), else None."""
    lowered = {c.lower(): c for c in choices}
    close = difflib.get_close_matches(value.lower(), list(lowered), n=1, cutoff=0.6)
    return f"did you mean {lowered[close[0]]!r}?" if close else None


def describe(node: YNode) -> str:
    """How a value reads in an error: ``a string 'sm_90'``, ``a number 12.1``, ``a list``."""
    if isinstance(node, YMap):
        return "a mapping"
    if isinstance(node, YSeq):
        return "a list"
    value = node.value
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"the boolean {node.raw}"
    if isinstance(value, (int, float)):
        return f"the number {node.raw}"
    return f"the string {value!r}"


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


class Schema:
    """Base validator: ``label`` completes "expected ..." in messages."""

    label = "a value"

    def validate(self, node: YNode, path: str, problems: Problems) -> Any:
        raise NotImplementedError

    def wrong_type(self, node: YNode, path: str, problems: Problems, hint: str | None = None) -> Any:
        if hint is None and isinstance(node, YScalar) and node.value is None:
            hint = "write [] for an empty list" if isinstance(self, ListOf) else "give a value"
        problems.add(node.where, f"{path or 'file'}: expected {self.label}, got {describe(node)}", hint)
        return INVALID


class Str(Schema):
    """A string, optionally matching ``pattern`` and an extra ``check`` (returns a problem).

    ``words``: the value is a name, so an unquoted YAML 1.1 boolean word (``N``,
    ``on``) is taken as that name; elsewhere such a word is refused.
    """

    def __init__(
        self,
        label: str = "a string",
        pattern: str | None = None,
        hint: str | None = None,
        check: Callable[[str], str | None] | None = None,
        *,
        words: bool = False,
    ) -> None:
        self.label = label
        self.pattern = re.compile(pattern) if pattern else None
        self.hint = hint
        self.check = check
        self.words = words

    def validate(self, node: YNode, path: str, problems: Problems) -> Any:
        if self.words and isinstance(node, YScalar) and node.word:
            problems.accepted_words.add(id(node))
        if not isinstance(node, YScalar) or not isinstance(node.value, str):
            hint = None
            if isinstance(node, YScalar) and node.value is not None:  # 12.10, 2024, true: YAML typed it
                hint = f'quote it: "{node.raw}"'
            elif isinstance(node, YSeq):
                hint = "give one value, not a list"
            return self.wrong_type(node, path, problems, hint)
        value = node.value
        if not value.strip():
            problems.add(node.where, f"{path}: expected {self.label}, got an empty string")
            return INVALID
        if self.pattern is not None and not self.pattern.fullmatch(value):
            problems.add(node.where, f"{path}: {value!r} is not {self.label}", self.hint)
            return INVALID
        if self.check is not None and (problem := self.check(value)):
            problems.add(node.where, f"{path}: {problem}", self.hint)
            return INVALID
        return value


class Glob(Str):
    """A non-empty glob over cell ids (``fnmatchcase``); ids never contain whitespace."""

    def __init__(self, label: str = "a glob pattern") -> None:
        super().__init__(label, pattern=r"\S+", hint="cell ids have no spaces; e.g. 'rms_norm.*-fp16-*'")


class Enum(Schema):
    """One of a fixed set of strings; near misses get a did-you-mean."""

    def __init__(self, values: Sequence[str], what: str) -> None:
        self.values = tuple(values)
        self.what = what
        self.label = f"{what} ({', '.join(self.values)})"

    def validate(self, node: YNode, path: str, problems: Problems) -> Any:
        if not isinstance(node, YScalar) or not isinstance(node.value, str):
            hint = f'quote it: "{node.raw}"' if isinstance(node, YScalar) and node.value is not None else None
            return self.wrong_type(node, path, problems, hint)
        if node.value not in self.values:
            hint = did_you_mean(node.value, self.values) or f"allowed: {', '.join(self.values)}"
            problems.add(node.where, f"{path}: unknown {self.what} {node.value!r}", hint)
            return INVALID
        return node.value


class Int(Schema):
    """An integer (booleans are not integers), optionally bounded or from ``choices``."""

    def __init__(self, minimum: int | None = None, choices: Sequence[int] = ()) -> None:
        self.minimum = minimum
        self.choices = tuple(choices)
        self.label = "an integer" if minimum is None else f"an integer >= {minimum}"
        if self.choices:
            self.label = f"one of {', '.join(map(str, self.choices))}"

    def validate(self, node: YNode, path: str, problems: Problems) -> Any:
        if not isinstance(node, YScalar) or isinstance(node.value, bool) or not isinstance(node.value, int):
            return self.wrong_type(node, path, problems)
        if (self.minimum is not None and node.value < self.minimum) or (
            self.choices and node.value not in self.choices
        ):
            problems.add(node.where, f"{path}: expected {self.label}, got {node.value}")
            return INVALID
        return node.value


class Float(Schema):
    """A finite number (ints accepted) above ``minimum`` (``strict``: not equal to it)."""

    def __init__(self, minimum: float | None = None, *, strict: bool = False) -> None:
        self.minimum = minimum
        self.strict = strict
        bound = "" if minimum is None else f" {'>' if strict else '>='} {minimum:g}"
        self.label = f"a number{bound}"

    def validate(self, node: YNode, path: str, problems: Problems) -> Any:
        value = node.value if isinstance(node, YScalar) else None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return self.wrong_type(node, path, problems)
        low = self.minimum
        if not math.isfinite(value) or (low is not None and (value <= low if self.strict else value < low)):
            problems.add(node.where, f"{path}: expected {self.label}, got {node.raw}")  # type: ignore[union-attr]
            return INVALID
        return float(value)


class Bool(Schema):
    label = "true or false"

    def validate(self, node: YNode, path: str, problems: Problems) -> Any:
        if not isinstance(node, YScalar) or not isinstance(node.value, bool):
            return self.wrong_type(node, path, problems)
        return node.value


class ListOf(Schema):
    """A list of ``item``; a lone scalar gets a ``write [x]`` hint."""

    def __init__(self, item: Schema, *, min_len: int = 0, unique: bool = False) -> None:
        self.item = item
        self.min_len = min_len
        self.unique = unique
        self.label = f"a list, each item {item.label}"

    def validate(self, node: YNode, path: str, problems: Problems) -> Any:
        if not isinstance(node, YSeq):
            hint = None
            if isinstance(node, YScalar) and node.value is not None:
                text = node.raw if re.fullmatch(r"[\w.+-]+", node.raw) else json.dumps(node.raw)
                hint = f"write [{text}]"
            return self.wrong_type(node, path, problems, hint)
        if len(node.items) < self.min_len:
            problems.add(node.where, f"{path}: needs at least {self.min_len} item(s), got {len(node.items)}")
            return INVALID
        values = [self.item.validate(item, _join(path, i), problems) for i, item in enumerate(node.items)]
        if self.unique:
            seen: set[Any] = set()
            for item, value in zip(node.items, values, strict=True):
                if value is INVALID or not isinstance(value, (str, int, float)):
                    continue
                if value in seen:
                    problems.add(item.where, f"{path}: {value!r} is listed twice")
                seen.add(value)
        return values


def _check_key(key: YScalar, path: str, problems: Problems) -> bool:
    if not isinstance(key.value, str):
        problems.add(key.where, f"{path}: key {key.raw!r} must be a string", f'quote it: "{key.raw}"')
        return False
    return True


class MapOf(Schema):
    """A mapping with free keys (validated by ``key``) and uniform values."""

    def __init__(self, key: Schema, value: Schema, *, min_len: int = 0) -> None:
        self.key = key
        self.value = value
        self.min_len = min_len
        self.label = f"a mapping of {key.label} to {value.label}"

    def validate(self, node: YNode, path: str, problems: Problems) -> Any:
        if not isinstance(node, YMap):
            return self.wrong_type(node, path, problems)
        if len(node.entries) < self.min_len:
            problems.add(node.where, f"{path}: needs at least {self.min_len} entry(ies)")
            return INVALID
        out: dict[str, Any] = {}
        for key, value in node:
            if _check_key(key, path, problems) and self.key.validate(key, path, problems) is not INVALID:
                out[str(key.value)] = self.value.validate(value, _join(path, str(key.value)), problems)
        return out


@dataclass(frozen=True)
class Field:
    schema: Schema
    required: bool = False


class Record(Schema):
    """A mapping with fixed keys: unknown keys get a did-you-mean, missing required keys are named.

    ``renamed`` maps a key's former name to its current one: a file still using
    the old name gets one error saying so (at that key's line), and its value is
    checked as the new key's, so the author sees the rename and nothing else.
    """

    def __init__(
        self, what: str, fields: Mapping[str, Field | Schema], renamed: Mapping[str, str] | None = None
    ) -> None:
        self.what = what
        self.fields = {k: f if isinstance(f, Field) else Field(f) for k, f in fields.items()}
        self.renamed = dict(renamed or {})
        self.label = f"a mapping ({what})"

    def validate(self, node: YNode, path: str, problems: Problems) -> Any:
        if not isinstance(node, YMap):
            return self.wrong_type(node, path, problems)
        out: dict[str, Any] = {}
        for key, value in node:
            if not _check_key(key, path, problems):
                continue
            name = str(key.value)
            if name in self.renamed and node.key(self.renamed[name]) is None:
                new = self.renamed[name]
                where = f" in {path}" if path else f" in {self.what}"
                problems.add(
                    key.where, f"key {name!r}{where} was renamed to {new!r}", f"write {new}: instead"
                )
                name = new
            spec = self.fields.get(name)
            if spec is None:
                allowed = list(self.fields)
                hint = did_you_mean(name, allowed) or f"allowed keys: {', '.join(allowed)}"
                where = f" in {path}" if path else f" in {self.what}"
                problems.add(key.where, f"unknown key {name!r}{where}", hint)
                continue
            out[name] = spec.schema.validate(value, _join(path, name), problems)
        old_names = {new: old for old, new in self.renamed.items()}
        for name, spec in self.fields.items():
            if spec.required and node.key(name) is None and node.key(old_names.get(name, name)) is None:
                problems.add(node.where, f"{path or self.what}: missing required key {name!r}")
                out[name] = INVALID
        return out


def valid(value: Any) -> bool:
    """True if ``value`` holds no ``INVALID`` anywhere (cross-field checks use only valid parts)."""
    if value is INVALID:
        return False
    if isinstance(value, dict):
        return all(valid(v) for v in value.values())
    if isinstance(value, list):
        return all(valid(v) for v in value)
    return True


def validate(schema: Schema, node: YNode, problems: Problems) -> Any:
    """Validate the whole tree in one pass.

    Containers come back even when parts are wrong (bad parts are ``INVALID``),
    so callers can still run cross-field checks on the valid parts and report
    everything at once.  YAML 1.1 boolean words the loader kept (``defer_words``)
    are errors unless the schema took them as names; each replaces whatever
    else was said about its line.
    """
    value = schema.validate(node, "", problems)
    words = [(w, is_key) for w, is_key in _words(node) if id(w) not in problems.accepted_words]
    if words:
        lines = {w.where for w, _ in words}
        problems.errors = [e for e in problems.errors if e.where not in lines]
        problems.errors += [yaml11_boolean(w.raw, w.where, is_key=is_key) for w, is_key in words]
    return value


def _words(node: YNode) -> list[tuple[YScalar, bool]]:
    """Every YAML 1.1 boolean word in the tree, with whether it is a mapping key."""
    if isinstance(node, YScalar):
        return [(node, False)] if node.word else []
    if isinstance(node, YSeq):
        return [w for item in node.items for w in _words(item)]
    found = []
    for key, value in node:
        if key.word:
            found.append((key, True))
        found += _words(value)
    return found
