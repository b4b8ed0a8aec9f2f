"""Composing a YAML document within bounds, and the integer spellings YAML 1.1 gets wrong.

Matrix configs and op specs come from other teams (``--ops-path``) and from
pull requests, so the loader (:mod:`matrix.yamlload`) composes them with
:class:`BoundedLoader`, which refuses a document past any of :data:`LIMITS`
at the line where it goes past: its size, its nesting depth, the items of one
collection, its aliases, and the number of values it expands to once every
alias is followed.  A YAML alias bomb (each level a list of aliases to the
one before: under 1 KB, 9**9 values) is refused while it is composed,
before a single alias is expanded, in milliseconds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import yaml

from opgate.matrix.errors import ConfigError, Location
from opgate.matrix.files import MAX_YAML_BYTES

_DECIMAL = re.compile(r"[-+]?(0|[1-9][0-9]*)")
#: Longest integer accepted (Python refuses to parse more than 4300 digits; no setting needs 20).
MAX_INT_DIGITS = 100


@dataclass(frozen=True)
class Limits:
    """What one YAML document may hold; opgate's own files use a small fraction of each."""

    depth: int = 32  # nesting levels, aliases followed (opgate's own files: 7)
    items: int = 1_000  # entries of one list or mapping
    aliases: int = 1_000  # ``*name`` references in the document
    values: int = 5_000  # scalars and collections once every alias is expanded (opgate's own: < 100)
    size: int = MAX_YAML_BYTES  # characters of the document


LIMITS = Limits()


class BoundedLoader(yaml.SafeLoader):
    """Safe loader that composes nodes within :data:`LIMITS` (and constructs plain scalars).

    PyYAML's composer recurses once per nesting level and keeps each alias as
    a reference to its anchor's node, so composing is cheap; the cost of an
    alias bomb only appears when the tree is expanded.  Each composed node is
    therefore weighed as it completes (values and depth it expands to, its
    aliases' anchors included), and the first node past a limit stops the
    load at its line.
    """

    def __init__(self, text: str, source: str, limits: Limits = LIMITS) -> None:
        super().__init__(text)
        self.source = source
        self.limits = limits
        self._depth = 0
        self._aliases = 0
        self._composed = 0
        self._weight: dict[int, tuple[int, int]] = {}  # id(node) -> (values, depth) when expanded

    def _refuse(self, problem: str, mark: yaml.Mark | None, hint: str) -> ConfigError:
        line = mark.line + 1 if mark is not None else 1
        return ConfigError(problem, Location(self.source, line), hint)

    def fetch_flow_collection_start(self, token: Any) -> None:
        """Refuse deep ``[[[[`` while scanning: PyYAML's scanner looks ahead per open flow level."""
        if self.flow_level >= self.limits.depth:
            raise self._refuse(
                f"nested deeper than {self.limits.depth} levels", self.get_mark(), "opgate files are shallow"
            )
        super().fetch_flow_collection_start(token)

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        lim, mark = self.limits, self.peek_event().start_mark
        if parent is not None and len(parent.value) >= lim.items:
            raise self._refuse(f"a collection holds more than {lim.items} entries", mark, "split the file")
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > lim.aliases:
                raise self._refuse(f"more than {lim.aliases} aliases", mark, "write the values out")
            alias: yaml.Node = super().compose_node(parent, index)  # type: ignore[assignment]
            return alias
        self._depth += 1
        self._composed += 1
        if self._depth > lim.depth:
            raise self._refuse(f"nested deeper than {lim.depth} levels", mark, "opgate files are shallow")
        if self._composed > lim.values:
            raise self._refuse(f"more than {lim.values} values", mark, "split the file")
        try:
            node: yaml.Node = super().compose_node(parent, index)  # type: ignore[assignment]
        finally:
            self._depth -= 1
        self._weigh(node)
        return node

    def _weigh(self, node: yaml.Node) -> None:
        if isinstance(node, yaml.ScalarNode):
            self._weight[id(node)] = (1, 1)
            return
        children = node.value if isinstance(node, yaml.SequenceNode) else [n for kv in node.value for n in kv]
        weights = [self._weight.get(id(child), (1, 1)) for child in children]  # an unfinished anchor: 1
        values = 1 + sum(w[0] for w in weights)
        depth = 1 + max((w[1] for w in weights), default=0)
        lim = self.limits
        if values > lim.values:
            problem = f"expands to more than {lim.values} values once its aliases are followed"
            raise self._refuse(problem, node.start_mark, "an alias bomb? write the values out")
        if depth > lim.depth:
            problem = f"nested deeper than {lim.depth} levels once its aliases are followed"
            raise self._refuse(problem, node.start_mark, "opgate files are shallow")
        self._weight[id(node)] = (values, depth)


def int_problem(raw: str) -> str | None:
    """Why a plain scalar PyYAML reads as an integer is not a plain decimal integer, or None."""
    digits = raw.lstrip("+-")
    if _DECIMAL.fullmatch(raw):
        too_long = len(digits) > MAX_INT_DIGITS
        return f"an integer of {len(digits)} digits (at most {MAX_INT_DIGITS})" if too_long else None
    if len(raw) > 40:
        why = "is not a plain decimal"
    elif digits[:2].lower() in ("0x", "0b", "0o"):
        why = "is not a decimal integer"
    elif "_" in raw:
        why = "is not a plain decimal (YAML 1.1 ignores the '_')"
    elif ":" in raw:
        why = "is a YAML 1.1 base-60 number"
    else:
        why = "has a leading zero: YAML 1.1 reads it as octal"
    shown = repr(raw) if len(raw) <= 40 else f"an integer of {len(raw)} characters"
    return f"{shown} {why}"
