"""Safe YAML loading that remembers where every value came from.

Config and op-spec mistakes must be reported as ``file:line`` before any work
starts, so the loader keeps a line for every mapping key, value and list item
instead of returning bare Python objects.  It also closes YAML's classic traps:

* only safe loading (``yaml.SafeLoader``): no tags that build Python objects;
* duplicate mapping keys are errors (PyYAML silently keeps the last one);
* YAML 1.1 booleans (``yes``/``no``/``on``/``off``/``y``/``n``, any case) are
  errors: ``arch: [on]`` or a key ``no:`` almost never mean a boolean.  Only
  ``true``/``false`` are booleans.  With ``defer_words`` they are kept as
  strings marked ``word`` and the schema decides (:func:`matrix.schema.validate`):
  where a name is expected (a shape symbol ``N``) the word is that name, and
  everywhere else it stays an error;
* ``1e-5`` is a number (YAML 1.2), not the string PyYAML makes of it;
* integers are plain decimals: YAML 1.1 reads ``010`` as 8, ``1_0`` as 10,
  ``1:30`` as 90 and ``0x1`` as 1, so those forms are errors, as are integers
  longer than :data:`MAX_INT_DIGITS` digits and floats with ``_`` or ``:``.

The document is composed within bounds (:mod:`matrix.yamlcompose`: size,
depth, collection sizes, aliases and expanded values), so an alias bomb or a
thousand-level ``[[[[`` is refused at its line in milliseconds.

Every YAML-level problem in a file is collected and raised at once as
:class:`~matrix.errors.ConfigErrors`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import yaml

from opgate.matrix.errors import ConfigError, ConfigErrors, Location
from opgate.matrix.files import read_text
from opgate.matrix.yamlcompose import LIMITS, BoundedLoader, Limits, int_problem

_TAG = "tag:yaml.org,2002:"
#: Plain words YAML 1.1 turns into booleans (PyYAML knows only some of them).
YAML11_BOOLEANS = frozenset({"yes", "no", "on", "off", "y", "n"})
#: YAML 1.2 core-schema floats that YAML 1.1 (PyYAML) leaves as strings, e.g. ``1e-5``.
_FLOAT12 = re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)$")
_SCALAR_TAGS = frozenset({f"{_TAG}{t}" for t in ("str", "int", "float", "bool", "null", "timestamp")})


@dataclass(frozen=True)
class YScalar:
    """A scalar with its source text; ``quoted`` scalars are always strings."""

    value: str | int | float | bool | None
    where: Location
    raw: str
    quoted: bool
    #: an unquoted YAML 1.1 boolean word kept as text (``defer_words``): the schema decides
    word: bool = False


@dataclass(frozen=True)
class YSeq:
    items: tuple[YNode, ...]
    where: Location


@dataclass(frozen=True)
class YMap:
    """A mapping in source order; keys are scalars so each keeps its own line."""

    entries: tuple[tuple[YScalar, YNode], ...]
    where: Location

    def get(self, key: str) -> YNode | None:
        return next((v for k, v in self.entries if k.value == key), None)

    def key(self, key: str) -> YScalar | None:
        return next((k for k, _ in self.entries if k.value == key), None)

    def __iter__(self) -> Iterator[tuple[YScalar, YNode]]:
        return iter(self.entries)


YNode: TypeAlias = "YScalar | YSeq | YMap"


def plain(node: YNode) -> Any:
    """The tree as ordinary Python values (dict / list / scalar), dropping lines."""
    if isinstance(node, YScalar):
        return node.value
    if isinstance(node, YSeq):
        return [plain(i) for i in node.items]
    return {k.value: plain(v) for k, v in node.entries}


def where_of(node: YNode | None, fallback: Location) -> Location:
    return node.where if node is not None else fallback


class _Builder:
    """Walks composed nodes into the annotated tree, collecting every problem."""

    def __init__(self, loader: BoundedLoader, source: str, defer_words: bool = False) -> None:
        self.loader = loader
        self.source = source
        self.defer_words = defer_words
        self.errors: list[ConfigError] = []
        self._active: set[int] = set()

    def loc(self, node: yaml.Node) -> Location:
        return Location(self.source, node.start_mark.line + 1)

    def build(self, node: yaml.Node) -> YNode:
        if id(node) in self._active:
            self.errors.append(ConfigError("recursive alias", self.loc(node), "expand the anchor by hand"))
            return YScalar(None, self.loc(node), "", quoted=False)
        self._active.add(id(node))
        try:
            if isinstance(node, yaml.MappingNode):
                return self._mapping(node)
            if isinstance(node, yaml.SequenceNode):
                self._check_tag(node, "seq")
                return YSeq(tuple(self.build(n) for n in node.value), self.loc(node))
            if isinstance(node, yaml.ScalarNode):
                return self._scalar(node, is_key=False)
            raise ConfigError(f"unexpected YAML node {type(node).__name__}", self.loc(node))
        finally:
            self._active.discard(id(node))

    def _check_tag(self, node: yaml.Node, expected: str) -> None:
        if node.tag != f"{_TAG}{expected}":
            self.errors.append(
                ConfigError(f"tag {node.tag!r} is not allowed", self.loc(node), "opgate files are plain data")
            )

    def _mapping(self, node: yaml.MappingNode) -> YMap:
        self._check_tag(node, "map")
        entries: list[tuple[YScalar, YNode]] = []
        seen: dict[Any, YScalar] = {}
        for key_node, value_node in node.value:
            if key_node.tag == f"{_TAG}merge":
                self.errors.append(
                    ConfigError("merge keys (<<) are not supported", self.loc(key_node), "write the keys out")
                )
                continue
            if not isinstance(key_node, yaml.ScalarNode):
                self.errors.append(ConfigError("mapping keys must be plain scalars", self.loc(key_node)))
                continue
            key = self._scalar(key_node, is_key=True)
            if key.value in seen:
                first = seen[key.value]
                self.errors.append(
                    ConfigError(
                        f"duplicate key {key.raw!r}",
                        key.where,
                        f"first defined at line {first.where.line}; YAML keeps only one",
                    )
                )
                continue
            seen[key.value] = key
            value = self.build(value_node)
            if isinstance(value, (YMap, YSeq)):  # a nested block is reported at its key's line
                value = dataclasses.replace(value, where=key.where)
            entries.append((key, value))
        return YMap(tuple(entries), self.loc(node))

    def _scalar(self, node: yaml.ScalarNode, *, is_key: bool) -> YScalar:
        where, raw = self.loc(node), str(node.value)
        quoted = node.style is not None  # quoted or block scalars are always text
        if not quoted and raw.lower() in YAML11_BOOLEANS:
            if not self.defer_words:
                self.errors.append(yaml11_boolean(raw, where, is_key=is_key))
            return YScalar(raw, where, raw, quoted, word=True)
        if node.tag not in _SCALAR_TAGS:
            self.errors.append(
                ConfigError(f"tag {node.tag!r} is not allowed", where, "opgate files are plain data")
            )
            return YScalar(raw, where, raw, quoted)
        if quoted or node.tag in (f"{_TAG}str", f"{_TAG}timestamp"):
            if not quoted and _FLOAT12.match(raw):
                return YScalar(float(raw), where, raw, quoted)
            return YScalar(raw, where, raw, quoted)
        number = self._number_problem(node.tag, raw)
        if number is not None:
            hint = "write a plain decimal" + (f', or quote it: "{raw}"' if len(raw) <= 40 else "")
            self.errors.append(ConfigError(number, where, hint))
            return YScalar(raw, where, raw, quoted)
        value = self.loader.construct_object(node)
        return YScalar(value, where, raw, quoted)

    @staticmethod
    def _number_problem(tag: str, raw: str) -> str | None:
        if tag == f"{_TAG}int":
            return int_problem(raw)
        if tag == f"{_TAG}float" and ("_" in raw or ":" in raw):
            return f"{raw!r} is a YAML 1.1 float ('_' and ':' change its value)"
        return None


def yaml11_boolean(raw: str, where: Location, *, is_key: bool) -> ConfigError:
    """The error for an unquoted YAML 1.1 boolean word where it is ambiguous."""
    hint = f'quote it: "{raw}"' if is_key else f'use true/false, or quote it: "{raw}"'
    return ConfigError(f"{'key' if is_key else 'value'} {raw!r} is a YAML 1.1 boolean", where, hint)


def parse_yaml(text: str, source: str, limits: Limits = LIMITS, *, defer_words: bool = False) -> YNode:
    """Parse one YAML document from ``text``; ``source`` names it in messages.

    ``defer_words``: keep YAML 1.1 boolean words as marked strings for the
    schema to judge (the caller must run :func:`matrix.schema.validate`).
    """
    if len(text) > limits.size:
        raise ConfigError(f"document is over {limits.size} characters", Location(source, 1), "split the file")
    loader: BoundedLoader | None = None
    try:
        loader = BoundedLoader(text, source, limits)  # the reader refuses NUL and control characters here
        node = loader.get_single_node()
        if node is None:
            raise ConfigError("file is empty", Location(source, 1), "see matrix/default.yaml or ops/SPEC.md")
        builder = _Builder(loader, source, defer_words)
        tree = builder.build(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 1
        problem = exc.problem or exc.context or "malformed YAML"
        raise ConfigError(f"YAML syntax: {problem}", Location(source, line), exc.context) from exc
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, max(exc.position, 0)) + 1
        character = exc.character if isinstance(exc.character, str) else chr(exc.character)
        problem = f"YAML: character {character!r} (#x{ord(character):04x}) is not allowed"
        raise ConfigError(problem, Location(source, line), "opgate files are plain text") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"YAML: {exc}", Location(source, 1)) from exc
    finally:
        if loader is not None:
            loader.dispose()
    if builder.errors:
        raise ConfigErrors(builder.errors)
    return tree


def load_yaml(path: Path, limits: Limits = LIMITS, *, defer_words: bool = False) -> YNode:
    """Read and parse ``path``; unreadable, oversized or non-UTF-8 files are config errors."""
    text = read_text(Path(path), what="a YAML file", limit=limits.size * 4, error=ConfigError)
    return parse_yaml(text, str(path), limits, defer_words=defer_words)
