"""GitHub Actions expressions (``${{ }}``), evaluated as GitHub does, for tests/workflow_local.py.

The subset opgate's workflows use: contexts with ``.`` / ``[]`` / ``*`` access,
literals, ``!``, ``&&`` and ``||`` (which return an operand, as GitHub's do),
``==`` / ``!=`` (strings compared case-insensitively), and ``always``,
``success``, ``failure``, ``cancelled``, ``contains``, ``fromJSON``,
``toJSON``.  Anything else raises rather than guessing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

_TOKEN = re.compile(
    r"\s*(?:(?P<num>-?\d+(?:\.\d+)?)|'(?P<str>(?:[^']|'')*)'|(?P<op>&&|\|\||==|!=|[!().,\[\]*])"
    r"|(?P<name>[A-Za-z_][\w-]*))"
)


class ExpressionError(ValueError):
    pass


def _truthy(value: Any) -> bool:
    return value not in (None, False, 0, "", 0.0)


def text_of(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, str) and isinstance(b, str):
        return a.lower() == b.lower()
    if isinstance(a, (int, float)) or isinstance(b, (int, float)):
        try:
            return float(a) == float(b)
        except (TypeError, ValueError):
            return False
    return bool(a == b)


class _Parser:
    """Recursive descent over GitHub's expression grammar (the subset opgate's workflows use)."""

    def __init__(self, text: str, contexts: Mapping[str, Any], status: Mapping[str, bool]) -> None:
        self.tokens: list[tuple[str, Any]] = []
        pos = 0
        while pos < len(text.rstrip()):
            match = _TOKEN.match(text, pos)
            if not match or match.end() == pos:
                raise ExpressionError(f"cannot read {text[pos:]!r} in {text!r}")
            kind = next(k for k in ("num", "str", "op", "name") if match.group(k) is not None)
            value: Any = match.group(kind)
            if kind == "num":
                value = float(value)
            elif kind == "str":
                value = value.replace("''", "'")
            self.tokens.append((kind, value))
            pos = match.end()
        self.i = 0
        self.text = text
        self.contexts = contexts
        self.status = status

    def peek(self) -> tuple[str, Any] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, op: str | None = None) -> tuple[str, Any]:
        token = self.peek()
        if token is None or (op is not None and token != ("op", op)):
            raise ExpressionError(f"expected {op or 'more'} in {self.text!r}")
        self.i += 1
        return token

    def parse(self) -> Any:
        value = self.or_()
        if self.peek() is not None:
            raise ExpressionError(f"unexpected {self.peek()} in {self.text!r}")
        return value

    def or_(self) -> Any:
        value = self.and_()
        while self.peek() == ("op", "||"):
            self.take()
            right = self.and_()
            value = value if _truthy(value) else right
        return value

    def and_(self) -> Any:
        value = self.unary()
        while self.peek() == ("op", "&&"):
            self.take()
            right = self.unary()
            value = right if _truthy(value) else value
        return value

    def unary(self) -> Any:
        if self.peek() == ("op", "!"):
            self.take()
            return not _truthy(self.unary())
        left = self.primary()
        if self.peek() in (("op", "=="), ("op", "!=")):
            op = self.take()[1]
            right = self.primary()
            return _equal(left, right) if op == "==" else not _equal(left, right)
        return left

    def primary(self) -> Any:
        kind, value = self.take()
        if kind in ("num", "str"):
            return value
        if (kind, value) == ("op", "("):
            inner = self.or_()
            self.take(")")
            return inner
        if kind != "name":
            raise ExpressionError(f"unexpected {value!r} in {self.text!r}")
        if value in ("true", "false", "null"):
            return {"true": True, "false": False, "null": None}[value]
        if self.peek() == ("op", "("):
            return self.path(self.call(value))
        if value not in self.contexts:
            raise ExpressionError(f"unknown context {value!r} in {self.text!r}")
        return self.path(self.contexts[value])

    def path(self, current: Any) -> Any:
        while self.peek() in (("op", "."), ("op", "[")):
            if self.take()[1] == "[":
                key = self.or_()
                self.take("]")
            else:
                key = self.take()[1]
            if key == "*":
                current = list(current.values() if isinstance(current, dict) else current or [])
                if self.peek() == ("op", "."):
                    self.take()
                    name = self.take()[1]
                    current = [c.get(name) if isinstance(c, dict) else None for c in current]
                continue
            if isinstance(current, list) and isinstance(key, float):
                current = current[int(key)] if 0 <= key < len(current) else None
            else:
                current = current.get(key) if isinstance(current, dict) else None
        return current

    def call(self, name: str) -> Any:
        self.take("(")
        args = []
        while self.peek() != ("op", ")"):
            args.append(self.or_())
            if self.peek() == ("op", ","):
                self.take()
        self.take(")")
        functions: dict[str, Callable[..., Any]] = {
            "always": lambda: True,
            "success": lambda: self.status["success"],
            "failure": lambda: not self.status["success"],
            "cancelled": lambda: False,
            "contains": lambda hay, needle: (
                any(_equal(x, needle) for x in hay)
                if isinstance(hay, list)
                else text_of(needle).lower() in text_of(hay).lower()
            ),
            "fromJSON": json.loads,
            "toJSON": lambda value: json.dumps(value, indent=2),
        }
        if name not in functions:
            raise ExpressionError(f"unknown function {name}() in {self.text!r}")
        return functions[name](*args)


def evaluate(text: str, contexts: Mapping[str, Any], success: bool = True) -> Any:
    """One expression (without ``${{ }}``)."""
    return _Parser(text, contexts, {"success": success}).parse()


def expand(value: Any, contexts: Mapping[str, Any]) -> Any:
    """A workflow value with its ``${{ }}`` parts evaluated (a lone expression keeps its type)."""
    if isinstance(value, dict):
        return {k: expand(v, contexts) for k, v in value.items()}
    if isinstance(value, list):
        return [expand(v, contexts) for v in value]
    if not isinstance(value, str) or "${{" not in value:
        return value
    whole = re.fullmatch(r"\s*\$\{\{(.*?)\}\}\s*", value, re.DOTALL)
    if whole:
        return evaluate(whole[1], contexts)
    return re.sub(r"\$\{\{(.*?)\}\}", lambda m: text_of(evaluate(m[1], contexts)), value, flags=re.DOTALL)


def condition(value: Any, contexts: Mapping[str, Any], success: bool) -> bool:
    """A job's or step's ``if:`` (implicitly ``success()`` when absent or status-free)."""
    if value is None:
        return success
    text = str(value).strip()
    whole = re.fullmatch(r"\$\{\{(.*)\}\}", text, re.DOTALL)
    text = whole[1] if whole else text
    if not re.search(r"\b(always|success|failure|cancelled)\(", text):
        text = f"success() && ({text})"
    return _truthy(evaluate(text, contexts, success))
