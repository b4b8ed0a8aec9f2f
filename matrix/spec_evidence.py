"""Cross-key checks of an implementation's ``evidence``: every GPU cell must have a kernel name to check.

Kept apart from :mod:`matrix.spec` (discovery, the typed view) so each reads in
one sitting.  Why refuse rather than run: a GPU cell whose kernel names were
never checked would pass on numbers alone, the silent fallback opgate exists
to catch; the spec author is told before any work, with ``file:line`` and the
fix (exit 3).
"""

from __future__ import annotations

import fnmatch
from typing import Any

from opgate.matrix.cell import ARCHES, Cell
from opgate.matrix.errors import Location
from opgate.matrix.schema import Problems, valid
from opgate.matrix.spec_schema import DEVICE_KINDS


def evidence_checks(
    name: str,
    raw: dict[str, Any],
    op: dict[str, Any],
    ev: dict[str, Any],
    *,
    where: Location,
    problems: Problems,
) -> None:
    """Some ``expect`` pattern at all, and a cuda one for every mode with GPU cells."""
    rules = [ev.get(dk) or {} for dk in DEVICE_KINDS] + [
        r for m in ev.get("modes", {}).values() for r in m.values()
    ]
    if not any(r.get("expect") for r in rules):
        problems.add(
            where,
            f"implementations.{name}.evidence: no expect pattern",
            "the fallback check needs the op event (cpu) or kernel name (cuda) that proves it ran",
        )
        return
    lacking = modes_without_gpu_evidence(name, raw, op, ev)
    if lacking:
        problems.add(
            where,
            f"implementations.{name}.evidence: no cuda expect pattern for mode(s) {', '.join(lacking)}: "
            "their GPU cells would pass without a kernel-name check",
            "add evidence.cuda.expect with the kernel name that proves the op ran on a GPU (a GPU cell lists "
            "the names it saw under 'kernels'), or declare those GPU cells unsupported",
        )


def modes_without_gpu_evidence(
    name: str, raw: dict[str, Any], op: dict[str, Any], ev: dict[str, Any]
) -> list[str]:
    """Claimed modes whose GPU cells would run without a cuda ``expect`` rule.

    A mode's own rule (``evidence.modes.MODE.cuda``) counts over the default;
    modes whose GPU cells are all declared ``unsupported`` (a CPU-only
    implementation) need none.
    """
    default = (ev.get("cuda") or {}).get("expect")
    modes = raw.get("modes", op.get("modes"))
    if not (isinstance(modes, list) and valid(modes)):
        return []
    return [
        m
        for m in modes
        if m != "build"
        and not ((ev.get("modes", {}).get(m, {}).get("cuda") or {}).get("expect", default))
        and not _gpu_cells_unsupported(name, raw, op, m)
    ]


def _gpu_cells_unsupported(name: str, raw: dict[str, Any], op: dict[str, Any], mode: str) -> bool:
    """True when ``unsupported`` globs cover every GPU cell of ``mode`` (any torch, CUDA, arch)."""
    globs = [
        u["match"]
        for u in raw.get("unsupported", [])
        if isinstance(u, dict) and isinstance(u.get("match"), str)
    ]
    if not globs:
        return False
    dtypes = raw.get("dtypes", op.get("dtypes")) or []
    layouts = raw.get("layouts", op.get("layouts")) or []
    ids = [
        Cell(
            op=str(op.get("op")), impl=name, torch="0.0", cuda="0.0", arch=a, dtype=d, layout=lay, mode=mode
        ).id
        for a in ARCHES[1:]
        for d in dtypes
        for lay in layouts
    ]
    return bool(ids) and all(any(fnmatch.fnmatchcase(i, g) for g in globs) for i in ids)
