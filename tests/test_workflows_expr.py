"""The local runner's expressions read as GitHub's do: the fan-out test relies on them."""

from __future__ import annotations

from typing import Any

import pytest

from tests.workflow_expr import ExpressionError, condition, evaluate, expand

CONTEXTS: dict[str, Any] = {
    "github": {
        "event": {"pull_request": {"labels": [{"name": "gpu-ok"}], "head": {"repo": {"full_name": "a/b"}}}}
    },
    "inputs": {"gpu-environment": "gpu", "max-jobs": 64, "empty": ""},
    "needs": {"plan": {"result": "success", "outputs": {"shards": "0", "matrix": '{"include": [{"n": 1}]}'}}},
    "matrix": {"runs_on": ["self-hosted", "gpu-sm90"], "name": "sm_90-1"},
}


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("!github.event.pull_request", False),
        ("contains(github.event.pull_request.labels.*.name, 'gpu-ok')", True),
        ("contains(github.event.pull_request.labels.*.name, 'GPU-OK')", True),  # case-insensitive
        ("needs.plan.outputs.shards != '0'", False),
        ("inputs.empty || 'fallback'", "fallback"),
        ("inputs.gpu-environment && 'yes'", "yes"),
        ("!contains(matrix.runs_on, 'self-hosted')", False),
        ("fromJSON(needs.plan.outputs.matrix).include[0].n", 1.0),
        ("inputs.max-jobs == '64'", True),
        ("github.event.missing.deeper", None),
    ],
)
def test_values(expression: str, value: Any) -> None:
    assert evaluate(expression, CONTEXTS) == value


def test_templates_and_conditions() -> None:
    assert expand("results-${{ matrix.name }}", CONTEXTS) == "results-sm_90-1"
    assert expand("${{ fromJSON(needs.plan.outputs.matrix) }}", CONTEXTS) == {"include": [{"n": 1}]}
    assert condition(None, CONTEXTS, success=False) is False  # no `if:`: success() only
    assert condition("always() && needs.plan.result == 'success'", CONTEXTS, success=False) is True
    assert condition("${{ inputs.empty }}", CONTEXTS, success=True) is False


@pytest.mark.parametrize("bad", ["nosuch.x", "format('{0}', 1)", "a ==", "'unterminated"])
def test_what_it_does_not_know_raises(bad: str) -> None:
    with pytest.raises(ExpressionError):
        evaluate(bad, CONTEXTS)
