"""Malformed results, state and report files, and bad argument sets, for the fuzz suite.

The companion of :mod:`tests.fuzz_inputs` (configs and specs): every JSON file a
stage reads (results.json, a cell record, run.json, compat.json, a diff, an
alert state, a plan manifest, benchmark and decoder-block files) gets the same
family of damage, and each command that reads it must answer exit 7 naming the
file; argument sets must answer with their documented code.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tests.fuzz_inputs import (
    BENCH,
    CONFIG,
    EMPTY,
    RESULTS,
    RESULTS_BAD,
    SMALL_CONFIG,
    TOY_OPS,
    USAGE,
    VALID,
    Call,
    Case,
    _write,
    file_traps,
    valid,
)


def json_traps(valid: dict[str, Any]) -> Iterator[tuple[str, bytes, bool]]:
    """(name, document, names a line?) for damage any JSON reader must survive."""
    text = json.dumps(valid, indent=1)
    raw = text.encode()
    yield "non-utf8", raw[:10] + b"\xff\xfe" + raw[10:], True
    yield "latin1", raw.replace(b'"', b'"\xe9', 1), True
    yield "truncated", raw[: len(raw) // 2], True
    yield "empty", b"", True
    yield "bom", b"\xef\xbb\xbf" + raw, False
    yield "trailing-garbage", raw + b"\n}{", True
    yield "deep-nesting", b"[" * 100_000 + b"]" * 100_000, False
    yield "huge-int", b'{"schema_version": ' + b"9" * 5000 + b"}", False
    for shape in ("[1]", "null", '"text"', "1", "true", "[]"):
        yield f"shape-{shape}", shape.encode(), False
    yield "nul", raw[:5] + b"\x00" + raw[5:], True


def _results(root: Path, doc: bytes | str, name: str = "results.json") -> Path:
    return _write(root / "run" / name, doc)


def _publish(root: Path, path: Path) -> Call:
    return Call(["publish", "--in", str(path.parent), "--out", str(root / "pub")], path)


def results_cases() -> Iterator[Case]:
    valid = json.loads(RESULTS.read_text())
    cell = valid["cells"][0]

    def doc_case(doc: bytes | str, line: bool = False) -> Callable[[Path], Call]:
        def build(root: Path) -> Call:
            path = _results(root, doc)
            call = _publish(root, path)
            return Call(call.argv, call.names, line)

        return build

    for name, doc, line in json_traps(valid):
        yield Case(f"results/{name}", doc_case(doc, line), (RESULTS_BAD,))
    broken: dict[str, Any] = {
        "no-version": {k: v for k, v in valid.items() if k != "schema_version"},
        "version-2": {**valid, "schema_version": 2},
        "version-str": {**valid, "schema_version": "1"},
        "cells-object": {**valid, "cells": {}},
        "cells-of-ints": {**valid, "cells": [1, 2]},
        "cells-of-lists": {**valid, "cells": [[]]},
        "cell-no-axes": {**valid, "cells": [{k: v for k, v in cell.items() if k != "axes"}]},
        "cell-axes-list": {**valid, "cells": [{**cell, "axes": []}]},
        "cell-bad-verdict": {**valid, "cells": [{**cell, "verdict": "great"}]},
        "cell-id-mismatch": {**valid, "cells": [{**cell, "id": "other.cell"}]},
        "cell-duration-text": {**valid, "cells": [{**cell, "duration_s": "slow"}]},
        "cell-duration-huge": {**valid, "cells": [{**cell, "duration_s": 10**400}]},
        "cell-checks-ints": {**valid, "cells": [{**cell, "checks": [1]}]},
        "cell-check-status": {**valid, "cells": [{**cell, "checks": [{"name": "x", "status": "meh"}]}]},
        "cell-overrides-list": {**valid, "cells": [{**cell, "overrides": [1, 2]}]},
        "cell-attempts-text": {**valid, "cells": [{**cell, "attempts": "two"}]},
        "missing-text": {**valid, "missing": "all"},
        "planned-text": {**valid, "planned": "many"},
        "argv-number": {**valid, "argv": 5},
    }
    for name, doc in broken.items():
        text = json.dumps(doc) if "huge" not in name else json.dumps(doc).replace("1" + "0" * 400, "9" * 5000)
        yield Case(f"results/{name}", doc_case(text), (RESULTS_BAD,))
    for name, make in file_traps("results.json"):
        yield Case(f"results/file-{name}", _results_file(make), (RESULTS_BAD,))
    yield Case("results/no-folder", lambda root: _publish(root, root / "nowhere" / "results.json"), (7,))
    yield from _other_json_cases(valid)


def _results_file(make: Callable[[Path], Path]) -> Callable[[Path], Call]:
    def build(root: Path) -> Call:
        path = make(root / "run")
        return _publish(root, path)

    return build


def _other_json_cases(results: dict[str, Any]) -> Iterator[Case]:
    """Cell records (collect), run.json (breakdown), compat/diff/state/manifest/bench/block files."""
    readers: dict[str, Callable[[Path, Path], list[str]]] = {
        "cell-record": lambda root, p: ["collect", "--out", str(p.parent.parent)],
        "run-record": lambda root, p: ["breakdown", str(p.parent)],
        "compat-base": lambda root, p: ["diff", "--base", str(p), "--head", str(p)],
        "history": lambda root, p: [
            "publish",
            "--in",
            str(RESULTS.parent),
            "--out",
            str(root / "o"),
            "--history",
            str(p),
        ],
        "plan-history": lambda root, p: [
            "plan",
            "--config",
            str(SMALL_CONFIG),
            "--ops-path",
            str(TOY_OPS),
            "--history",
            str(p),
        ],
        "manifest": lambda root, p: [
            "publish",
            "--in",
            str(RESULTS.parent),
            "--out",
            str(root / "o"),
            "--manifest",
            str(p),
        ],
        "diff": lambda root, p: ["alert", "--diff", str(p), "--platform", "webhook", "--no-state"],
        "bench": lambda root, p: ["bench", "--in", str(p)],
        "inventory-bench": lambda root, p: ["inventory", "--bench", str(p)],
        "block": lambda root, p: [
            "publish",
            "--in",
            str(RESULTS.parent),
            "--out",
            str(root / "o"),
            "--block",
            str(p),
        ],
    }
    where = {"cell-record": "run/cells/x.json", "run-record": "run/run.json"}
    for kind, argv in readers.items():
        for name, doc, line in json_traps({"cells": [], "schema_version": 1}):
            yield Case(f"{kind}/{name}", _json_reader(kind, doc, line, argv, where), (RESULTS_BAD,))
    yield Case(
        "cell-record/foreign",
        _json_reader("cell-record", b'{"id": 1}', False, readers["cell-record"], where),
        (RESULTS_BAD,),
    )
    yield Case(
        "manifest/shards-ints",
        _json_reader(
            "manifest", b'{"manifest_version": 1, "shards": [1]}', False, readers["manifest"], where
        ),
        (RESULTS_BAD,),
    )
    yield Case(
        "bench/rows-text",
        _json_reader(
            "bench", b'{"meta": {}, "op": "x", "rows": [{"shape": 1}]}', False, readers["bench"], where
        ),
        (RESULTS_BAD,),
    )
    yield Case(
        "block/missing-keys",
        _json_reader("block", b'{"config": {}}', False, readers["block"], where),
        (RESULTS_BAD,),
    )


def _json_reader(
    kind: str,
    doc: bytes,
    line: bool,
    argv: Callable[[Path, Path], list[str]],
    where: dict[str, str],
) -> Callable[[Path], Call]:
    def build(root: Path) -> Call:
        path = _write(root / where.get(kind, f"{kind}.json"), doc)
        if kind == "run-record":
            _write(root / "run" / "results.json", RESULTS.read_bytes())
        return Call(argv(root, path), path, line)

    return build


def state_cases() -> Iterator[Case]:
    """Alert states that cannot be read: refused (7) before anything is posted."""
    for name, doc, line in json_traps({"version": 1, "sent": {}}):
        yield Case(f"alert-state/{name}", _state(doc, line), (RESULTS_BAD,))
    for name, doc in (
        ("version-2", b'{"version": 2, "sent": {}}'),
        ("sent-list", b'{"version": 1, "sent": []}'),
    ):
        yield Case(f"alert-state/{name}", _state(doc, False), (RESULTS_BAD,))
    for name, make in file_traps("state.json"):
        if name != "missing":  # no state yet is the normal first run
            yield Case(f"alert-state/file-{name}", _state_file(make), (RESULTS_BAD,))


def _state(doc: bytes, line: bool) -> Callable[[Path], Call]:
    def build(root: Path) -> Call:
        path = _write(root / "state.json", doc)
        argv = [
            "alert",
            "--diff",
            str(valid(root, "diff.json")),
            "--platform",
            "webhook",
            "--state",
            str(path),
        ]
        return Call(argv, path, line)

    return build


def _state_file(make: Callable[[Path], Path]) -> Callable[[Path], Call]:
    def build(root: Path) -> Call:
        path = make(root)
        argv = [
            "alert",
            "--diff",
            str(valid(root, "diff.json")),
            "--platform",
            "webhook",
            "--state",
            str(path),
        ]
        return Call(argv, path)

    return build


def _argv_call(argv: list[str]) -> Callable[[Path], Call]:
    """A case that runs ``opgate ARGV`` as given (no files to write)."""

    def build(root: Path) -> Call:
        return Call(argv)

    return build


def argument_cases() -> Iterator[Case]:
    """Argument sets: each must end with its documented code, never a traceback."""
    cfg = ["--config", str(SMALL_CONFIG), "--ops-path", str(TOY_OPS)]
    plain: dict[str, tuple[list[str], tuple[int, ...]]] = {
        "no-command": ([], (USAGE,)),
        "unknown-command": (["frobnicate"], (USAGE,)),
        "list-unknown-flag": (["list", "--nope"], (USAGE,)),
        "list-select-nothing": (["list", *cfg, "--select", "no-such-op.*"], (EMPTY,)),
        "list-ops-path-missing": (["list", *cfg, "--ops-path", "/nonexistent/ops"], (USAGE,)),
        "list-ops-path-file": (["list", *cfg, "--ops-path", str(SMALL_CONFIG)], (USAGE,)),
        "plan-max-jobs-text": (["plan", *cfg, "--max-jobs", "many"], (USAGE,)),
        "plan-max-jobs-huge": (["plan", *cfg, "--max-jobs", "9" * 5000], (USAGE,)),
        "plan-max-jobs-zero": (["plan", *cfg, "--max-jobs", "0"], (USAGE, CONFIG)),
        "plan-target-negative": (["plan", *cfg, "--target-s", "-1"], (USAGE,)),
        "plan-target-nan": (["plan", *cfg, "--target-s", "nan"], (USAGE,)),
        "plan-history-missing": (["plan", *cfg, "--history", "/nonexistent/compat.json"], (USAGE,)),
        "run-no-out": (["run", *cfg], (USAGE,)),
        "run-jobs-zero": (["run", *cfg, "--out", "/tmp/x", "--jobs", "0"], (USAGE,)),
        "run-timeout-negative": (["run", *cfg, "--out", "/tmp/x", "--timeout", "-1"], (USAGE,)),
        "run-memory-text": (["run", *cfg, "--out", "/tmp/x", "--memory-mb", "lots"], (USAGE,)),
        "run-retries-9": (["run", *cfg, "--out", "/tmp/x", "--retries", "9"], (USAGE,)),
        "publish-no-in": (["publish", "--out", "/tmp/x"], (USAGE,)),
        "diff-no-head": (["diff", "--base", str(RESULTS)], (USAGE,)),
        "alert-bad-platform": (["alert", "--diff", "x.json", "--platform", "irc"], (USAGE,)),
        "breakdown-nothing": (["breakdown"], (USAGE,)),
        "perf-unknown": (["perf", "nope"], (USAGE,)),
    }
    for name, (argv, codes) in plain.items():
        yield Case(f"args/{name}", _argv_call(argv), codes)
    yield from _alert_argument_cases()
    yield from _output_cases(cfg)


def _alert_argument_cases() -> Iterator[Case]:
    for flag, value in (
        ("--attempts", "0"),
        ("--attempts", "1000"),
        ("--timeout", "nan"),
        ("--timeout", "inf"),
        ("--timeout", "-1"),
        ("--timeout", "1e400"),
        ("--backoff", "-1"),
        ("--max-wait", "inf"),
        ("--timeout", "soon"),
    ):

        def build(root: Path, flag: str = flag, value: str = value) -> Call:
            diff = _write(root / "diff.json", b"{}")
            return Call(["alert", "--diff", str(diff), "--platform", "slack", flag, value])

        yield Case(f"args/alert{flag}={value}", build, (USAGE,))


def _output_cases(cfg: list[str]) -> Iterator[Case]:
    """``--out`` (and other outputs) where nothing can be written: one line, exit 2."""

    def file_out(argv: Callable[[Path], list[str]]) -> Callable[[Path], Call]:
        def build(root: Path) -> Call:
            target = _write(root / "a-file", "not a folder\n")
            return Call([*argv(root), "--out", str(target)], target)

        return build

    yield Case("out/run-is-a-file", file_out(lambda r: ["run", *cfg, "--no-progress"]), (USAGE,))
    yield Case(
        "out/publish-is-a-file", file_out(lambda r: ["publish", "--in", str(RESULTS.parent)]), (USAGE,)
    )
    yield Case("out/collect-is-a-file", file_out(lambda r: ["collect"]), (USAGE,))
    for name, argv in {
        "run": ["run", *cfg, "--no-progress"],
        "publish": ["publish", "--in", str(RESULTS.parent)],
        "diff": ["diff", "--base", VALID, "--head", VALID],
        "bench": ["bench", "--in", str(BENCH)],
        "collect": ["collect"],
    }.items():
        yield Case(f"out/{name}-unwritable", _unwritable(argv), (USAGE,))
    for name, argv in {
        "diff": ["diff", "--base", VALID, "--head", VALID],
        "bench": ["bench", "--in", str(BENCH)],
        "inventory": ["inventory"],
    }.items():
        yield Case(f"out/{name}-disk-full", _dev_full(argv), (USAGE,))
    yield Case(
        "out/manifest-disk-full", lambda root: Call(["plan", *cfg, "--manifest", "/dev/full"]), (USAGE,)
    )


def _valid_args(root: Path, argv: list[str]) -> list[str]:
    return [str(valid(root, "compat.json")) if a == VALID else a for a in argv]


def _unwritable(argv: list[str]) -> Callable[[Path], Call]:
    """An output folder under /sys: refused to everyone, root included (EPERM)."""

    def build(root: Path) -> Call:
        return Call([*_valid_args(root, argv), "--out", "/sys/opgate-fuzz/out"], Path("/sys/opgate-fuzz"))

    return build


def _dev_full(argv: list[str]) -> Callable[[Path], Call]:
    """A full disk: /dev/full takes the open and refuses every write (ENOSPC)."""

    def build(root: Path) -> Call:
        return Call([*_valid_args(root, argv), "--out", "/dev/full"], Path("/dev/full"))

    return build
