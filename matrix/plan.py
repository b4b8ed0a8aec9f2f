"""Cells -> CI shards: the GitHub Actions fan-out, and the manifest publishing checks.

A shard is one CI job.  It never mixes runner label sets, torch versions or
CUDA versions (one job = one machine kind = one install), and shards are
balanced by expected duration with greedy LPT bin packing: longest cells
first, each to the currently lightest shard.  Durations come from a previous
``compat.json`` / ``results.json`` when given (``--history``), else from
per-mode estimates calibrated on whatever history there is.

The plan is also the *manifest*: the exact cell ids each shard owns.  The
publish step refuses to publish while a planned shard is missing, so a job
that silently vanished can never shrink the published matrix.
"""

from __future__ import annotations

import bisect
import heapq
import json
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opgate.matrix.cell import Cell, torch_major_minor
from opgate.matrix.errors import ConfigError, Location, ResultsFormatError, UsageError
from opgate.matrix.files import read_json
from opgate.matrix.modes import MODES

DEFAULT_MAX_JOBS = 64
GHA_MAX_JOBS = 256  # GitHub's cap on jobs per matrix
GHA_OUTPUT_LIMIT = 1_000_000  # bytes: job outputs are capped at 1 MB
DEFAULT_TARGET_S = 600.0  # split a group only while its shards would run longer than this
MANIFEST_VERSION = 1
#: Seconds per cell when no history says otherwise (:attr:`opgate.matrix.modes.Mode.estimate_s`).
DEFAULT_ESTIMATE_S: Mapping[str, float] = {name: m.estimate_s for name, m in MODES.items()}


@dataclass(frozen=True)
class Shard:
    """One CI job: where it runs, what it installs, which cells it owns."""

    name: str
    runs_on: tuple[str, ...]
    torch: str
    cuda: str
    cell_ids: tuple[str, ...]
    select: tuple[str, ...]
    expected_s: float

    def to_gha(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "runs_on": list(self.runs_on),
            "torch": self.torch,
            "cuda": self.cuda,
            "select": list(self.select),
            "cells": len(self.cell_ids),
            "expected_s": round(self.expected_s, 1),
        }


@dataclass(frozen=True)
class Plan:
    shards: tuple[Shard, ...]

    def gha_json(self) -> str:
        """Single-line ``{"include": [...]}`` for a job output and ``fromJSON``; refuses > 1 MB."""
        text = json.dumps({"include": [s.to_gha() for s in self.shards]}, separators=(",", ":"))
        size = len(text.encode())
        if size >= GHA_OUTPUT_LIMIT:
            raise UsageError(
                f"plan is {size} bytes, over GitHub's {GHA_OUTPUT_LIMIT}-byte job output limit "
                "(use fewer --max-jobs, or --select fewer cells)"
            )
        return text

    def manifest(self) -> dict[str, Any]:
        return {
            "manifest_version": MANIFEST_VERSION,
            "cells": sum(len(s.cell_ids) for s in self.shards),
            "shards": [
                {
                    "name": s.name,
                    "runs_on": list(s.runs_on),
                    "torch": s.torch,
                    "cuda": s.cuda,
                    "cells": list(s.cell_ids),
                }
                for s in self.shards
            ],
        }


@dataclass(frozen=True)
class Manifest:
    """What the publish step checks: every planned shard, and every cell, reported."""

    shards: Mapping[str, tuple[str, ...]]

    def cell_ids(self) -> set[str]:
        return {c for ids in self.shards.values() for c in ids}

    def missing_shards(self, reported: Iterable[str]) -> list[str]:
        """Planned shard names absent from ``reported`` (shard names seen in results)."""
        seen = set(reported)
        return [name for name in self.shards if name not in seen]

    def incomplete_shards(self, present_ids: Iterable[str]) -> list[str]:
        """Shards with at least one planned cell id missing from the merged results."""
        present = set(present_ids)
        return [name for name, ids in self.shards.items() if not present.issuperset(ids)]


def load_manifest(path: Path) -> Manifest:
    data = read_json(Path(path), what="plan manifest", expect=dict)
    try:
        if data.get("manifest_version") != MANIFEST_VERSION:
            raise ResultsFormatError(f"{path}: manifest_version {data.get('manifest_version')!r}, expected 1")
        return Manifest({str(s["name"]): tuple(map(str, s["cells"])) for s in data["shards"]})
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ResultsFormatError(f"{path}: not a plan manifest: {type(exc).__name__}: {exc}") from exc


#: The longest duration a history may give one cell (a week): past it, it is not a measurement.
MAX_DURATION_S = 7 * 24 * 3600.0


def load_history(path: Path) -> dict[str, float]:
    """Per-cell ``duration_s`` from a compat.json or results.json (the longest when repeated)."""
    if not Path(path).exists():
        raise UsageError(f"--history {path}: no such file")
    doc = read_json(Path(path), what="--history (a compat.json or results.json)", expect=dict)
    try:
        records = doc["cells"]
        out: dict[str, float] = {}
        for n, rec in enumerate(records):
            seconds = float(rec.get("duration_s", 0.0))
            if not 0.0 <= seconds < MAX_DURATION_S:  # NaN fails it too
                raise ValueError(f"cells[{n}] ({rec['id']}): duration_s {seconds!r} is not a duration")
            out[str(rec["id"])] = max(seconds, out.get(str(rec["id"]), 0.0))
    except (ValueError, KeyError, TypeError, AttributeError, OverflowError) as exc:
        why = f"{type(exc).__name__}: {exc}"
        raise ResultsFormatError(f"--history {path}: not a compat.json/results.json: {why}") from exc
    return out


def estimate(cells: Sequence[Cell], history: Mapping[str, float]) -> dict[str, float]:
    """Expected seconds per cell: its history, else the median of its (arch, mode) peers, else a default."""
    keyed = [(cell.id, (cell.arch, cell.mode)) for cell in cells]
    peers: dict[tuple[str, str], list[float]] = defaultdict(list)
    for cid, peer in keyed:
        if cid in history:
            peers[peer].append(history[cid])
    medians = {peer: statistics.median(values) for peer, values in peers.items()}
    return {
        cid: history[cid] if cid in history else medians.get(peer, DEFAULT_ESTIMATE_S.get(peer[1], 10.0))
        for cid, peer in keyed
    }


def _count_prefix(sorted_ids: Sequence[str], prefix: str) -> int:
    """How many of ``sorted_ids`` start with ``prefix`` (what the glob ``prefix*`` matches)."""
    return bisect.bisect_left(sorted_ids, prefix + "\U0010ffff") - bisect.bisect_left(sorted_ids, prefix)


def compact_select(owned: Iterable[str], universe: Sequence[str]) -> list[str]:
    """Shortest ``prefix*`` globs (else exact ids) that select exactly ``owned`` out of ``universe``.

    ``universe`` (sorted) is every cell id the shard's runner expands from the
    same config.  A prefix ending at an id-part boundary becomes a glob only
    when every universe id starting with it is owned, so the runner selects
    exactly this shard's cells (``op1.x*`` would also catch ``op10.x``: counted).
    """
    mine = sorted(set(owned))
    out: list[str] = []
    i = 0
    while i < len(mine):
        parts = mine[i].split("-")
        prefixes = ("-".join(parts[:k]) for k in range(1, len(parts) + 1))
        best = next((p for p in prefixes if _count_prefix(universe, p) == _count_prefix(mine, p)), None)
        if best is None:
            out.append(mine[i])
            i += 1
        else:
            out.append(best + "*")
            i += _count_prefix(mine, best)  # sorted: the covered ids are the next ones
    return out


@dataclass(frozen=True)
class _Chunk:
    """Cell ids sharing a prefix of ``depth`` id parts: packed together so one glob selects them."""

    depth: int
    ids: tuple[str, ...]
    seconds: float

    def split(self, durations: Mapping[str, float]) -> list[_Chunk]:
        children: dict[str, list[str]] = defaultdict(list)
        for cid in self.ids:
            children["-".join(cid.split("-")[: self.depth + 1])].append(cid)
        return [
            _Chunk(self.depth + 1, tuple(ids), sum(durations[i] for i in ids))
            for _, ids in sorted(children.items())
        ]


def _chunks(ids: Sequence[str], durations: Mapping[str, float], bins: int) -> list[_Chunk]:
    """Split prefix chunks until none exceeds a quarter of a shard's fair share (or is one cell).

    LPT leaves shards within one item of each other, so items of at most a
    quarter share keep shards within ~25% while whole prefixes stay together.
    """
    total = sum(durations[i] for i in ids)
    limit = total / bins / 4
    todo = [_Chunk(0, tuple(ids), total)]
    done: list[_Chunk] = []
    while todo:
        chunk = todo.pop()
        if chunk.seconds > limit and len(chunk.ids) > 1:
            todo += chunk.split(durations)
        else:
            done.append(chunk)
    return done


def _pack(ids: Sequence[str], durations: Mapping[str, float], bins: int) -> list[tuple[str, ...]]:
    """Greedy LPT over prefix chunks: longest first onto the lightest bin (ties: lower index)."""
    order = sorted(_chunks(ids, durations, bins), key=lambda ch: (-ch.seconds, ch.ids[0]))
    heap = [(0.0, i) for i in range(bins)]
    packed: list[list[str]] = [[] for _ in range(bins)]
    for chunk in order:
        load, i = heapq.heappop(heap)
        packed[i].extend(chunk.ids)
        heapq.heappush(heap, (load + chunk.seconds, i))
    return [tuple(sorted(b)) for b in packed if b]


def _allocate(totals: list[float], caps: list[int], max_jobs: int) -> list[int]:
    """Shards per group: one each, then one more to the group with the longest shards, up to its cap."""
    alloc = [1] * len(totals)
    for _ in range(max_jobs - len(totals)):
        open_groups = [i for i in range(len(totals)) if alloc[i] < caps[i]]
        if not open_groups:
            break
        best = max(open_groups, key=lambda i: (totals[i] / alloc[i], -i))
        alloc[best] += 1
    return alloc


_GroupKey = tuple[tuple[str, ...], str, str]  # (runner labels, torch, cuda): one machine kind, one install


def make_plan(
    cells: Sequence[Cell],
    runners: Mapping[str, Sequence[str]],
    *,
    universe: Sequence[Cell] = (),
    max_jobs: int = DEFAULT_MAX_JOBS,
    history: Mapping[str, float] | None = None,
    target_s: float = DEFAULT_TARGET_S,
    runners_where: Location | None = None,
) -> Plan:
    """Shard ``cells``; ``universe`` = every cell the runners' config expands to (for compact globs)."""
    if not 1 <= max_jobs <= GHA_MAX_JOBS:
        raise UsageError(f"--max-jobs {max_jobs}: must be 1..{GHA_MAX_JOBS} (GitHub's matrix limit)")
    missing = sorted({c.arch for c in cells if not runners.get(c.arch)})
    if missing:
        raise ConfigError(
            f"runners: no labels for arch {', '.join(missing)}",
            runners_where,
            f"add e.g. runners: {{{missing[0]}: [self-hosted, linux, gpu-{missing[0].replace('_', '')}]}}",
        )
    groups: dict[_GroupKey, list[str]] = defaultdict(list)
    arches: dict[_GroupKey, set[str]] = defaultdict(set)
    for cell in cells:
        key = (tuple(runners[cell.arch]), cell.torch, cell.cuda)
        groups[key].append(cell.id)
        arches[key].add(cell.arch)

    def stem(key: _GroupKey) -> str:
        cuda = "" if key[2] == "none" else f"-cu{key[2]}"
        return f"{'+'.join(sorted(arches[key]))}-pt{torch_major_minor(key[1])}{cuda}"

    keys = sorted(groups, key=lambda k: (stem(k), k))
    if len(keys) > max_jobs:
        raise UsageError(
            f"--max-jobs {max_jobs}: the plan needs at least {len(keys)} (one per runner/torch/cuda)"
        )
    durations = estimate(cells, history or {})
    totals = [sum(durations[i] for i in groups[k]) for k in keys]
    caps = [max(1, min(len(groups[k]), math.ceil(t / target_s))) for k, t in zip(keys, totals, strict=True)]
    universe_ids = sorted({*(c.id for c in universe), *(i for ids in groups.values() for i in ids)})
    shards: list[Shard] = []
    for key, n in zip(keys, _allocate(totals, caps, max_jobs), strict=True):
        labels, torch, cuda = key
        packed = _pack(groups[key], durations, n)
        shards += [
            Shard(
                name=f"{stem(key)}-{i}of{len(packed)}",
                runs_on=labels,
                torch=torch.split("+", 1)[0],  # the job installs the build for its own cuda
                cuda=cuda,
                cell_ids=ids,
                select=tuple(compact_select(ids, universe_ids)),
                expected_s=sum(durations[c] for c in ids),
            )
            for i, ids in enumerate(packed, 1)
        ]
    return Plan(tuple(shards))
