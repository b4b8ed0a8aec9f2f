"""What changed between two published matrices: the PR comment and the alert feed.

Cells are matched by (cell id, device): the device is the GPU that ran the
cell, or ``cpu``.  Matching on the full environment key would turn a triton or
torch patch bump into "every cell removed, every cell new" and hide exactly
the breakage a bump causes.  When one side has several environments for a
slot, its worst verdict speaks.

Categories (buckets from :mod:`reports.view`):

* ``new_failures``    head fails (fail/error/flaky), base did not (or had no such cell)
* ``new_fallbacks``   head falls back, base passed, was untested or absent
* ``fixes``           base failed or fell back, head passes
* ``became_untested`` base produced a verdict, head skipped the cell or lost it
* ``environment``     head's mode is broken in its environment (the op's own reference fails
                      the same way: verdict ``environment``), base was not
* ``other_changes``   any other verdict change (fail -> fallback, pass -> unsupported, ...)
* ``perf_regressions`` from :func:`reports.perf.perf_regressions`

A regression (what ``--fail-on-regression`` and alerts act on) is a new
failure, a new fallback or a perf regression.  Lost coverage is reported but
does not gate: a runner outage must not block every PR.  Neither does a mode
the environment broke: it is reported under ``environment``, never as the op's
regression.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from opgate.matrix.files import read_json
from opgate.reports.compat import SCHEMA_DIR, Compat, validate_document
from opgate.reports.merge import Entry
from opgate.reports.perf import PerfRule, perf_regressions
from opgate.reports.view import bucket, one_line_reason, worst
from opgate.validators.env import Fingerprint

DIFF_SCHEMA_FILE = SCHEMA_DIR / "diff.schema.json"
DIFF_SCHEMA_ID = "urn:opgate:schema:diff:1"
CATEGORIES = ("new_failures", "new_fallbacks", "fixes", "became_untested", "environment", "other_changes")
REGRESSION_KINDS = {"new_failures": "new_failure", "new_fallbacks": "new_fallback"}


@dataclass
class Diff:
    base: dict[str, str]
    head: dict[str, str]
    rule: PerfRule
    changes: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    perf: list[dict[str, Any]] = field(default_factory=list)
    unchanged: int = 0

    @property
    def regression_count(self) -> int:
        return len(self.changes["new_failures"]) + len(self.changes["new_fallbacks"]) + len(self.perf)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": DIFF_SCHEMA_ID,
            "schema_version": 1,
            "base": self.base,
            "head": self.head,
            "rule": asdict(self.rule),
            "summary": {
                **{name: len(self.changes[name]) for name in CATEGORIES},
                "perf_regressions": len(self.perf),
                "unchanged": self.unchanged,
                "regressions": self.regression_count,
            },
            **{name: self.changes[name] for name in CATEGORIES},
            "perf_regressions": self.perf,
        }


def _device(entry: Entry, environments: Mapping[str, Mapping[str, Any]]) -> str:
    return Fingerprint.from_json(environments.get(entry.env_key, {})).gpu_name or "cpu"


def _slots(compat: Compat) -> dict[tuple[str, str], Entry]:
    groups: dict[tuple[str, str], list[Entry]] = {}
    for entry in compat.entries:
        groups.setdefault((entry.result.id, _device(entry, compat.environments)), []).append(entry)
    return {key: worst(group) for key, group in groups.items()}


def _record(key: tuple[str, str], base: Entry | None, head: Entry | None) -> dict[str, Any]:
    shown = head or base
    assert shown is not None
    axes = shown.result.cell.axes()
    # The head explains the change (its skip reason too); a cell gone from head says so.
    reason = one_line_reason(head.result) if head else "no result in head (cell dropped or not run)"
    return {
        "cell": key[0],
        "device": key[1],
        "env_key": shown.env_key,
        **{k: axes[k] for k in ("op", "impl", "torch", "cuda", "arch", "dtype", "layout", "mode")},
        "base": base.result.verdict.value if base else None,
        "head": head.result.verdict.value if head else None,
        "reason": reason,
        "repro": shown.result.repro,
    }


_RULES: tuple[tuple[str, Callable[[str | None, str | None], bool]], ...] = (
    ("environment", lambda before, after: after == "environment" and before != "environment"),
    ("new_failures", lambda before, after: after == "fail" and before != "fail"),
    (
        "new_fallbacks",
        lambda before, after: after == "fallback" and before in (None, "pass", "untested", "unsupported"),
    ),
    ("fixes", lambda before, after: after == "pass" and before in ("fail", "fallback")),
    (
        "became_untested",
        lambda before, after: before not in (None, "untested") and after in (None, "untested"),
    ),
)


def _category(base: Entry | None, head: Entry | None) -> str | None:
    """The first rule a (base, head) pair matches; ``None`` for no change worth reporting."""
    if base and head and base.result.verdict is head.result.verdict:
        return None
    before = bucket(base.result.verdict) if base else None
    after = bucket(head.result.verdict) if head else None
    category = next((name for name, rule in _RULES if rule(before, after)), None)
    if category is None and base is not None and head is not None:
        category = "other_changes"  # a new or dropped cell with nothing to say stays None
    return category


def compute(
    base: Compat, head: Compat, base_name: str = "base", head_name: str = "head", rule: PerfRule | None = None
) -> Diff:
    """Diff two compat documents."""
    rule = rule or PerfRule()
    base_slots, head_slots = _slots(base), _slots(head)
    diff = Diff(
        base={"path": base_name, "generated_at": base.generated_at},
        head={"path": head_name, "generated_at": head.generated_at},
        rule=rule,
        changes={name: [] for name in CATEGORIES},
    )
    for key in sorted(set(base_slots) | set(head_slots)):
        before, after = base_slots.get(key), head_slots.get(key)
        category = _category(before, after)
        if category is None:
            diff.unchanged += before is not None and after is not None
            continue
        diff.changes[category].append(_record(key, before, after))
    diff.perf = [r.to_json() for r in perf_regressions(base.to_json(), head.to_json(), rule)]
    return diff


def dumps(diff: Diff) -> str:
    doc = diff.to_json()
    validate_document(doc, "diff (being written)", DIFF_SCHEMA_FILE)
    return json.dumps(doc, indent=1, ensure_ascii=False) + "\n"


def load(path: Path) -> dict[str, Any]:
    """Read and validate a JSON diff (the alert command's input)."""
    doc = read_json(path, what="diff", expect=dict)
    validate_document(doc, str(path), DIFF_SCHEMA_FILE)
    result: dict[str, Any] = doc
    return result
