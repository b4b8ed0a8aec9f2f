"""Bytes and FLOPs of one shape, from the spec's ``cost`` expressions: the one parser and evaluator.

Spec validation (:mod:`opgate.matrix.spec`, at load time, before any work), the
perf check, ``opgate perf bench`` and ``opgate inventory`` all go through this
module, so an expression the schema accepts is one perf can evaluate: there is
no second grammar to drift (``M ^ 2`` is refused at load, with file:line, not
on the GPU).

A spec is data written by op authors (and by third parties through
``--ops-path``), so its cost expressions are parsed with :mod:`ast` and only
arithmetic is evaluated: numbers, the shape's symbols, ``itemsize``, ``+ - * /
// % **``, unary minus and parentheses.  Attribute access, calls, subscripts
and unknown names are rejected with an error naming the expression and the
offending piece; nothing is ever handed to ``eval``.

Which symbol is which dimension.  Shapes in a spec are positional lists, so
the symbols are bound by a convention, overridable per op:

* ``cost.symbols: [B, S, H, D, L]`` in the spec names the positions explicitly
  (needed whenever the default below does not fit, e.g. rope's
  ``[B, S, H, D, layout]``);
* otherwise by rank: 1-D ``N``; 2-D ``M, N``; 3-D ``M, K, N`` (GEMM);
  4-D ``B, H, S, D`` (attention).
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

#: Default symbol names by shape rank (see the module docstring).
DEFAULT_SYMBOLS: dict[int, tuple[str, ...]] = {
    1: ("N",),
    2: ("M", "N"),
    3: ("M", "K", "N"),
    4: ("B", "H", "S", "D"),
}
ITEMSIZE = "itemsize"
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

_BINOPS: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNOPS: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}
#: Exponents above this are refused: ``10 ** 10 ** 10`` must not hang a worker.
MAX_EXPONENT = 64
#: Longest expression accepted: real ones are a line (``2 * M * N * itemsize``).
MAX_EXPRESSION = 1000


class CostError(ValueError):
    """A cost expression or symbol binding that cannot be evaluated (the message says where)."""


def symbols_for(shape: Sequence[int], names: Sequence[str] | None = None) -> dict[str, int]:
    """Bind a shape's dimensions to symbol names (explicit ``names`` or the rank default)."""
    dims = [int(d) for d in shape]
    if names is None:
        if len(dims) not in DEFAULT_SYMBOLS:
            raise CostError(
                f"shape {dims} has rank {len(dims)}, which has no default symbols; "
                "add cost.symbols (one name per dimension) to the spec"
            )
        names = DEFAULT_SYMBOLS[len(dims)]
    names = list(names)
    if len(names) != len(dims):
        raise CostError(f"cost.symbols {names} name {len(names)} dimensions but shape {dims} has {len(dims)}")
    for name in names:
        if not _IDENT.fullmatch(name) or name == ITEMSIZE:
            raise CostError(f"cost.symbols: {name!r} is not a usable symbol name")
    if len(set(names)) != len(names):
        raise CostError(f"cost.symbols {names} repeat a name")
    return dict(zip(names, dims, strict=True))


#: The cost keys that hold expressions, and the direction each belongs to.
EXPRESSION_KEYS = ("bytes", "flops", "backward_bytes", "backward_flops")
#: "forward+backward": one training step of the op (the forward, then autograd.grad), both costs summed.
DIRECTIONS = ("forward", "backward", "forward+backward")


def parse(text: str) -> ast.Expression:
    """The syntax tree of one cost expression, refused unless it is plain arithmetic.

    The same walk :func:`evaluate` does, without values: a node the evaluator
    would reject (``^``, a call, a subscript) is rejected here, at spec load.
    """
    if not isinstance(text, str):
        raise CostError(f"cost expression must be a string, got {type(text).__name__}")
    if len(text) > MAX_EXPRESSION:
        raise CostError(f"cost expression of {len(text)} characters (at most {MAX_EXPRESSION})")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise CostError(f"cost {text!r} is not an expression: {exc.msg}") from exc
    except (RecursionError, MemoryError, ValueError) as exc:  # ValueError: a 5000-digit literal
        raise CostError(f"cost expression {text[:40]!r}...: nested too deeply or too long") from exc
    for node in ast.walk(tree.body):
        if not _allowed(node):
            raise _not_allowed(node, text)
    return tree


def _allowed(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
    if isinstance(node, ast.BinOp):
        return type(node.op) in _BINOPS
    if isinstance(node, ast.UnaryOp):
        return type(node.op) in _UNOPS
    return isinstance(node, (ast.Name, ast.Load, ast.operator, ast.unaryop))


def _not_allowed(node: ast.AST, text: str) -> CostError:
    shown = node.op if isinstance(node, (ast.BinOp, ast.UnaryOp)) else node
    piece = ast.unparse(node)
    return CostError(
        f"cost {text!r}: {type(shown).__name__} {piece!r} is not allowed "
        "(only numbers, shape symbols, itemsize, + - * / // % ** and parentheses)"
    )


def check(text: str) -> str | None:
    """The schema's check of one expression: None when :func:`parse` accepts it, else why not."""
    try:
        parse(text)
    except CostError as exc:
        return str(exc)
    return None


def _eval(node: ast.AST, env: Mapping[str, float], text: str) -> float:
    if isinstance(node, ast.Expression):
        return _eval(node.body, env, text)
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, (int, float))
        and not isinstance(node.value, bool)
    ):
        try:
            number = float(node.value)
        except OverflowError as exc:
            raise CostError(f"cost {text!r}: the number {node.value} is out of range") from exc
        if not math.isfinite(number):
            raise CostError(f"cost {text!r}: the number {ast.unparse(node)} is out of range")
        return number
    if isinstance(node, ast.Name):
        if node.id not in env:
            known = ", ".join(sorted(env))
            raise CostError(
                f"cost {text!r}: unknown symbol {node.id!r} (known here: {known}); "
                "name the shape's dimensions with cost.symbols in the spec"
            )
        return float(env[node.id])
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _eval(node.left, env, text), _eval(node.right, env, text)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise CostError(f"cost {text!r}: exponent {right:g} is larger than {MAX_EXPONENT}")
        try:
            value = float(_BINOPS[type(node.op)](left, right))
        except ZeroDivisionError as exc:
            raise CostError(f"cost {text!r}: division by zero") from exc
        except (OverflowError, TypeError) as exc:  # TypeError: a negative base to a fractional power
            raise CostError(f"cost {text!r}: {ast.unparse(node)!r} is out of range ({exc})") from exc
        if not math.isfinite(value):
            raise CostError(f"cost {text!r}: {ast.unparse(node)!r} is out of range")
        return value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNOPS:
        return float(_UNOPS[type(node.op)](_eval(node.operand, env, text)))
    raise _not_allowed(node, text)


def evaluate(text: str, env: Mapping[str, float]) -> float:
    """Value of one cost expression with ``env`` bound (symbols and ``itemsize``)."""
    return _eval(parse(text), env, text)


def shape_cost(
    cost: Mapping[str, Any], shape: Sequence[int], itemsize: int, direction: str = "forward"
) -> tuple[float | None, float | None]:
    """(bytes, flops) of ``shape`` from a spec's ``cost`` mapping; None where not declared.

    ``direction="backward"`` reads the optional ``backward_bytes`` / ``backward_flops`` keys.
    """
    if direction not in DIRECTIONS:
        raise CostError(f"direction must be one of {', '.join(DIRECTIONS)}, got {direction!r}")
    if direction == "forward+backward":
        fwd, bwd = shape_cost(cost, shape, itemsize), shape_cost(cost, shape, itemsize, "backward")
        return tuple(  # type: ignore[return-value]
            None if a is None or b is None else a + b for a, b in zip(fwd, bwd, strict=True)
        )
    raw_symbols = cost.get("symbols")
    if isinstance(raw_symbols, str):
        raw_symbols = [s.strip() for s in raw_symbols.split(",") if s.strip()]
    env: dict[str, float] = {**symbols_for(shape, raw_symbols), ITEMSIZE: float(itemsize)}
    prefix = "" if direction == "forward" else "backward_"
    keys = (f"{prefix}bytes", f"{prefix}flops")
    values = [evaluate(cost[key], env) if cost.get(key) else None for key in keys]
    return values[0], values[1]


def problems(cost: Mapping[str, Any], shapes: Sequence[Sequence[int]]) -> list[tuple[str, str]]:
    """(cost key, why) for every expression that cannot be evaluated on one of the spec's ``shapes``.

    Run at spec load: an unknown symbol, a rank the symbols do not name, a
    division by zero at a declared shape — all found before any cell runs,
    with the key to point at.  One problem per key (the first shape that fails).
    """
    found: dict[str, str] = {}
    raw_symbols = cost.get("symbols")
    for shape in shapes:
        try:
            env = {**symbols_for(shape, raw_symbols), ITEMSIZE: 2.0}
        except CostError as exc:
            found.setdefault("symbols", f"shape {list(shape)}: {exc}")
            continue
        for key in EXPRESSION_KEYS:
            if key in found or not cost.get(key):
                continue
            try:
                evaluate(cost[key], env)
            except CostError as exc:
                found[key] = f"shape {list(shape)}: {exc}"
    return list(found.items())
