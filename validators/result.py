"""The one result record: every check writes into it, every report renders from it.

Nothing else in opgate decides what a verdict means.  ``results.json`` is a
list of :class:`CellResult` plus the run's environment; reports read only this
file, so validation and publishing can run on different machines.

Verdicts (cell level), strongest first when combining checks:

* ``error``       crash, timeout, signal, broken infrastructure (profiler saw nothing)
* ``fail``        wrong numbers or a failing check
* ``flaky``       failed once, passed on a fresh re-run
* ``fallback``    numbers right, but the op's own kernel did not run / extra copies ran
* ``pass``        every applicable check passed
* ``unsupported`` the spec declares the cell unsupported and the op refused it clearly
* ``environment`` the mode is broken in this environment: the op's own reference, run
                  through the same mode by the same machinery (the cell's *control*,
                  :mod:`validators.controls`), fails the same way, so the op is not blamed
* ``skip``        cannot run here (no such device, no such nvcc, ...)

``environment`` is never a check's own finding: the runner gives it to a failed
cell after comparing it with its control, keeping the cell's checks and saying
what the op's own result was.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opgate.matrix.cell import Cell
from opgate.matrix.errors import ResultsFormatError
from opgate.matrix.files import expect_type, read_json, write_output

RESULTS_SCHEMA_VERSION = 1


class Verdict(str, enum.Enum):
    PASS = "pass"  # noqa: S105  (a verdict, not a password)
    FAIL = "fail"
    FALLBACK = "fallback"
    ERROR = "error"
    SKIP = "skip"
    UNSUPPORTED = "unsupported"
    FLAKY = "flaky"
    ENVIRONMENT = "environment"

    @property
    def is_bad(self) -> bool:
        """Verdicts that turn a gate red (not ``environment``: the op is not at fault there)."""
        return self in (Verdict.FAIL, Verdict.FALLBACK, Verdict.ERROR, Verdict.FLAKY)

    @property
    def ran(self) -> bool:
        return self != Verdict.SKIP


#: Combining order: the first verdict present among checks wins.
_SEVERITY = (
    Verdict.ERROR,
    Verdict.FAIL,
    Verdict.FALLBACK,
    Verdict.ENVIRONMENT,
    Verdict.UNSUPPORTED,
    Verdict.PASS,
)


@dataclass
class CheckResult:
    """What one check found.  ``status`` uses the cell verdict vocabulary.

    ``summary`` is one human line (shown in tables and alerts); ``details`` is
    structured evidence (errors, kernel names, counts) shown in the dashboard.
    """

    name: str
    status: Verdict
    summary: str = ""
    details: dict[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0
    #: of ``duration_s``: blocked while another worker compiled a Triton kernel this check needed
    #: (:mod:`validators.tritoncache`) or built a library it loads (:mod:`validators.cuda_build`);
    #: the run breakdown counts it as waiting, not as work
    waited_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """The record (``details`` as is: JSON data, not copied; ``asdict`` deep-copied it, per write)."""
        doc = {
            "name": self.name,
            "status": self.status.value,
            "summary": self.summary,
            "details": self.details,
            "duration_s": self.duration_s,
        }
        if self.waited_s >= 0.0005:
            doc["waited_s"] = round(self.waited_s, 3)
        return doc

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> CheckResult:
        return cls(
            name=str(d["name"]),
            status=Verdict(d["status"]),
            summary=str(d.get("summary", "")),
            details=dict(d.get("details") or {}),
            duration_s=float(d.get("duration_s", 0.0)),
            waited_s=float(d.get("waited_s") or 0.0),
        )


def combine(checks: Iterable[CheckResult]) -> Verdict:
    """Cell verdict from its checks.  No applicable check ran -> ``skip`` is wrong: ``error``."""
    statuses = {c.status for c in checks if c.status is not Verdict.SKIP}
    if not statuses:
        return Verdict.ERROR
    for v in _SEVERITY:
        if v in statuses:
            return v
    return Verdict.ERROR


@dataclass
class CellResult:
    """One record per cell in ``results.json``."""

    cell: Cell
    verdict: Verdict
    env: dict[str, Any]
    checks: list[CheckResult] = field(default_factory=list)
    kernels: list[str] = field(default_factory=list)
    duration_s: float = 0.0
    reason: str = ""  # why skip / error / unsupported, one line
    seed: int | None = None
    repro: str = ""
    attempts: int = 1
    #: of ``duration_s``: set-up time spent building the op's CUDA extension (the run breakdown's)
    setup_build_s: float = 0.0
    #: of ``duration_s``: set-up time blocked on another process's build of the same library
    setup_wait_s: float = 0.0

    @property
    def id(self) -> str:
        return self.cell.id

    def check(self, name: str) -> CheckResult | None:
        return next((c for c in self.checks if c.name == name), None)

    def to_json(self) -> dict[str, Any]:
        extra = {
            k: round(v, 3)
            for k, v in (("setup_build_s", self.setup_build_s), ("setup_wait_s", self.setup_wait_s))
            if v >= 0.0005
        }
        return {
            "id": self.cell.id,
            "axes": self.cell.axes(),
            "overrides": dict(self.cell.overrides),
            "verdict": self.verdict.value,
            "reason": self.reason,
            "env": self.env,
            "checks": [c.to_json() for c in self.checks],
            "kernels": self.kernels,
            "duration_s": round(self.duration_s, 4),
            "seed": self.seed,
            "repro": self.repro,
            "attempts": self.attempts,
            **extra,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> CellResult:
        try:
            cell = Cell.from_json({**d["axes"], "overrides": d.get("overrides") or {}})
            if cell.id != d["id"]:
                raise ResultsFormatError(f"record id {d['id']!r} does not match its axes ({cell.id!r})")
            return cls(
                cell=cell,
                verdict=Verdict(d["verdict"]),
                env=dict(d.get("env") or {}),
                checks=[CheckResult.from_json(c) for c in d.get("checks") or []],
                kernels=list(d.get("kernels") or []),
                duration_s=float(d.get("duration_s", 0.0)),
                reason=str(d.get("reason", "")),
                seed=d.get("seed"),
                repro=str(d.get("repro", "")),
                attempts=int(d.get("attempts", 1)),
                setup_build_s=float(d.get("setup_build_s") or 0.0),
                setup_wait_s=float(d.get("setup_wait_s") or 0.0),
            )
        except (KeyError, ValueError, TypeError, AttributeError, OverflowError) as exc:
            name = d.get("id", "?") if isinstance(d, Mapping) else "?"
            raise ResultsFormatError(f"malformed cell record {name!r}: {type(exc).__name__}: {exc}") from exc


@dataclass
class RunResults:
    """Contents of one ``results.json``: a run (or shard) on one machine.

    ``planned`` is how many cells the run set out to produce and ``missing``
    the ids of those it did not (an interrupted run collected from its
    ``cells/``): a report built from it must say it is incomplete.  Files
    written before these fields existed read as complete.

    ``controls`` are the environment controls that ran (:mod:`validators.controls`):
    records of the same type, kept apart from ``cells`` because they judge the
    environment, not an op (they are never counted, gated or diffed as op cells).
    """

    cells: list[CellResult]
    env: dict[str, Any]
    started_at: str = ""
    finished_at: str = ""
    argv: list[str] = field(default_factory=list)
    shard: str = ""
    planned: int | None = None
    missing: list[str] = field(default_factory=list)
    controls: list[CellResult] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": RESULTS_SCHEMA_VERSION,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "argv": self.argv,
            "shard": self.shard,
            "planned": self.planned,
            "missing": self.missing,
            "env": self.env,
            "cells": [c.to_json() for c in self.cells],
            "controls": [c.to_json() for c in self.controls],
        }

    def to_compact_json(self) -> dict[str, Any]:
        """The committed form: :func:`compact_record` of every cell (see there for what is kept)."""
        doc = self.to_json()
        doc["cells"] = [compact_record(c, self.env) for c in doc["cells"]]
        doc["controls"] = [compact_record(c, self.env) for c in doc["controls"]]
        return doc

    def write(
        self,
        path: Path,
        *,
        compact: bool = False,
        encoded: Mapping[str, tuple[CellResult, str]] | None = None,
    ) -> dict[str, Any]:
        """Write atomically; returns the document written (callers need not serialise it again).

        ``compact``: the committed form (a cell's env only where it differs from the run's).
        Either form has one cell record per line: a republish that changes a few verdicts
        changes a few lines, and the encoder is the C one (indented JSON goes through
        Python's own, seconds for a matrix of 1700 cells).  ``encoded``: cell id -> (record,
        its :func:`encode_record` line) made earlier, used for the cells that are still that
        very record (a run encodes each cell once, when it stores it).
        """
        doc = self.to_compact_json() if compact else self.to_json()
        lines = None
        if encoded and not compact:
            made = [(c, encoded.get(c.id)) for c in self.cells]
            lines = [m[1] if m is not None and m[0] is c else None for c, m in made]
        text = dumps_one_record_per_line(doc, "cells", lines)
        write_output(path, text + "\n", atomic=True)
        return doc

    @classmethod
    def read(cls, path: Path) -> RunResults:
        data = read_json(path, what="results file", expect=dict)
        version = data.get("schema_version")
        if version != RESULTS_SCHEMA_VERSION:
            raise ResultsFormatError(
                f"{path}: results schema_version {version!r}, this opgate reads {RESULTS_SCHEMA_VERSION}"
            )
        env = expect_type(data.get("env") or {}, dict, str(path), "'env'", ResultsFormatError)
        where = str(path)
        missing = expect_type(data.get("missing") or [], list, where, "'missing'", ResultsFormatError)
        planned = data.get("planned")
        if planned is not None:
            expect_type(planned, int, where, "'planned'", ResultsFormatError)

        def records(key: str) -> list[CellResult]:
            found = expect_type(data.get(key, []), list, where, f"'{key}'", ResultsFormatError)
            out = []
            for i, record in enumerate(found):
                expect_type(record, dict, where, f"{key}[{i}]", ResultsFormatError)
                try:
                    # a compact record leaves out an env equal to the run's (compact_record)
                    out.append(CellResult.from_json({"env": env, **record}))
                except ResultsFormatError as exc:
                    raise ResultsFormatError(f"{path}: {key}[{i}]: {exc}") from None
            return out

        try:
            return cls(
                cells=records("cells"),
                env=dict(env),
                started_at=str(data.get("started_at", "")),
                finished_at=str(data.get("finished_at", "")),
                argv=[str(a) for a in data.get("argv") or []],
                shard=str(data.get("shard", "")),
                planned=planned,
                missing=[str(m) for m in missing],
                controls=records("controls"),
            )
        except (TypeError, ValueError) as exc:
            raise ResultsFormatError(f"{path}: malformed run metadata: {exc}") from None


#: Detail keys that name files inside the run folder (profiler traces): the committed form of a
#: run does not carry those files, so it does not carry their paths either.
RUN_FILE_KEYS = frozenset({"trace"})
#: Checks whose details a later publish reads back even when they pass: perf's points are the
#: perf history (reports.perf), its samples the regression test's data.
HISTORY_CHECKS = frozenset({"perf"})
_PLAIN_STATUSES = frozenset({Verdict.PASS.value, Verdict.SKIP.value})


def compact_check(check: Mapping[str, Any]) -> dict[str, Any]:
    """One check as a committed run keeps it.

    Name, status, summary and duration always (tables, reasons, the time breakdown);
    details only where they explain a verdict that is not ``pass``/``skip`` (the dashboard's
    evidence of a red cell) or feed history (:data:`HISTORY_CHECKS`).  The details of a
    passing check restate its summary at length (every comparison, every graph) and are
    most of a run's bytes.  A re-run's record (``attempt_N``) keeps its checks the same way.
    """
    out = {k: v for k, v in check.items() if k != "details"}
    details = dict(check.get("details") or {})
    if check.get("status") in _PLAIN_STATUSES and check.get("name") not in HISTORY_CHECKS:
        details = {}
    for key in RUN_FILE_KEYS:
        details.pop(key, None)
    if isinstance(details.get("checks"), list):
        details["checks"] = [compact_check(c) for c in details["checks"] if isinstance(c, Mapping)]
    if details:
        out["details"] = details
    return out


def compact_record(record: Mapping[str, Any], run_env: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A cell record (``CellResult.to_json``) in the committed form: every verdict-bearing field.

    Id, axes, verdict, reason, kernels, repro, seed and durations stay; checks go through
    :func:`compact_check`; ``env`` is left out when it is ``run_env`` (the run's, or the
    environment its ``env_key`` names), which readers put back.  Verdicts, tables, diffs,
    perf history and the time breakdown read the same from either form.
    """
    out = {k: v for k, v in record.items() if k not in ("checks", "env")}
    if run_env is None or record.get("env") != run_env:
        out["env"] = record.get("env") or {}
    out["checks"] = [compact_check(c) for c in record.get("checks") or []]
    return out


def encode_record(record: Any) -> str:
    """One record of :func:`dumps_one_record_per_line`: compact JSON on one line."""
    return json.dumps(record, separators=(",", ":"), ensure_ascii=False)


def dumps_one_record_per_line(
    doc: Mapping[str, Any], key: str, encoded: Sequence[str | None] | None = None
) -> str:
    """JSON of ``doc`` with the list ``doc[key]`` last and one compact record per line.

    ``encoded``: per record of ``doc[key]``, its :func:`encode_record` line if already made.
    """
    head = json.dumps({k: v for k, v in doc.items() if k != key}, separators=(",", ":"), ensure_ascii=False)
    made = encoded if encoded is not None else [None] * len(doc[key])
    records = ",\n".join(line or encode_record(r) for r, line in zip(doc[key], made, strict=True))
    body = f"[\n{records}\n]" if records else "[]"
    return f"{head[:-1]}{',' if head != '{}' else ''}{json.dumps(key)}:{body}}}"
