"""Cost expressions (matrix.cost): arithmetic only, symbols bound by rank or by the spec."""

from __future__ import annotations

import pytest

from opgate.matrix.cost import CostError, evaluate, shape_cost, symbols_for
from opgate.matrix.spec import load_specs


def test_rms_norm_bytes_and_flops_from_its_spec() -> None:
    spec = load_specs()["rms_norm"]
    nbytes, flops = shape_cost(spec.cost, (32768, 8192), 2)
    assert nbytes == 2 * 32768 * 8192 * 2 + 8192 * 2
    assert flops == 4 * 32768 * 8192


def test_every_spec_cost_evaluates_or_asks_for_symbols() -> None:
    """A spec whose shapes do not fit the rank default gets an error that says how to fix it."""
    evaluated = set()
    needs_symbols: list[str] = []
    for spec in load_specs().values():
        for shape in (s for shapes in spec.shapes.values() for s in shapes):
            try:
                nbytes, flops = shape_cost(spec.cost, shape, 2)
            except CostError as exc:
                needs_symbols.append(str(exc))
                continue
            assert nbytes is None or nbytes >= 0
            assert flops is None or flops >= 0
            evaluated.add(spec.op)
    assert all("cost.symbols" in message for message in needs_symbols), needs_symbols
    assert {"rms_norm", "silu_mul", "fused_add_rms_norm", "matmul", "sdpa"} <= evaluated


def test_gemm_and_attention_rank_defaults() -> None:
    assert symbols_for((64, 96, 80)) == {"M": 64, "K": 96, "N": 80}
    assert symbols_for((2, 4, 64, 32)) == {"B": 2, "H": 4, "S": 64, "D": 32}
    assert shape_cost({"flops": "2 * M * K * N"}, (8, 16, 4), 4) == (None, 2 * 8 * 16 * 4)


def test_explicit_symbols_override_the_rank_default() -> None:
    cost = {"symbols": ["B", "S", "H", "D", "L"], "bytes": "2 * B * S * (H + H // 2) * D * itemsize"}
    assert shape_cost(cost, (4, 4096, 32, 128, 0), 2)[0] == 2 * 4 * 4096 * 48 * 128 * 2
    assert shape_cost({"symbols": "M, N", "bytes": "M * N"}, (3, 5), 1)[0] == 15


def test_backward_keys() -> None:
    cost = {"bytes": "2 * M * N * itemsize", "backward_bytes": "3 * M * N * itemsize"}
    assert shape_cost(cost, (4, 8), 2, "backward") == (3 * 4 * 8 * 2, None)
    with pytest.raises(CostError, match="direction"):
        shape_cost(cost, (4, 8), 2, "sideways")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("M.bit_length()", "Call"),
        ("M.real", "Attribute"),
        ("__import__('os').system('true')", "Call"),
        ("[M][0]", "Subscript"),
        ("(lambda: 1)()", "Call"),
        ("M if N else K", "IfExp"),
        ("M < N", "Compare"),
        ("'abc' * M", "Constant"),
        ("True + M", "Constant"),
        ("Q * M", "unknown symbol 'Q'"),
        ("2 ** 10 ** 10", "exponent"),
        ("M / (N - N)", "division by zero"),
        ("M +", "not an expression"),
    ],
)
def test_rejects_everything_but_arithmetic(text: str, message: str) -> None:
    with pytest.raises(CostError, match=message) as info:
        evaluate(text, {"M": 3, "N": 4, "K": 5, "itemsize": 2})
    assert repr(text) in str(info.value)  # the error names the expression it refused


def test_symbol_binding_errors_are_explained() -> None:
    with pytest.raises(CostError, match="rank 5"):
        symbols_for((1, 2, 3, 4, 5))
    with pytest.raises(CostError, match="2 dimensions but shape"):
        symbols_for((1, 2, 3), ["M", "N"])
    with pytest.raises(CostError, match="repeat"):
        symbols_for((1, 2), ["M", "M"])
    with pytest.raises(CostError, match="not a usable symbol"):
        symbols_for((1, 2), ["M", "itemsize"])


def test_arithmetic_is_python_arithmetic() -> None:
    env = {"M": 7, "N": 3, "itemsize": 2}
    for text in ("M * N + 1", "M / N", "M // N", "M % N", "-M + N ** 2", "(M + N) * itemsize", "1e3 * M"):
        assert evaluate(text, env) == pytest.approx(eval(text, {}, dict(env)))
