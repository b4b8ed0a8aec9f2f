"""Malformed inputs for the fuzz suite (tests/test_fuzz_inputs.py): what careless users and attackers feed CI.

Each :class:`Case` writes its files under a scratch folder and returns the
``opgate`` argv that reads them, the exit codes it may end with, and the file
(and whether a line) its message must name.  The cases are generated from a
few valid inputs by systematic mutation (every byte-level trap at several
places, every key given every wrong type, every depth of an alias bomb), plus
the hand-written cases of issue 15; ``test_fuzz_inputs`` runs them all.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SMALL_CONFIG = ROOT / "tests" / "data" / "config" / "small.yaml"
TOY_OPS = ROOT / "tests" / "data" / "config" / "ops"
RESULTS = ROOT / "tests" / "data" / "reports" / "validators-cpu" / "results.json"
BENCH = ROOT / "results" / "runs" / "h200-bench" / "rms_norm.json"
CONFIG, USAGE, EMPTY, SHARD, RESULTS_BAD, ALERT = 3, 2, 4, 6, 7, 8
#: Folder beside every case's own folder holding valid inputs (a compat.json, a diff.json) it may read.
VALID = "_valid"


def valid(root: Path, name: str) -> Path:
    return root.parent / VALID / name


@dataclass(frozen=True)
class Call:
    argv: list[str]
    names: Path | None = None  # the message must name this file
    line: bool = False  # ... as ``file:LINE``


@dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[Path], Call]
    codes: tuple[int, ...]


def _write(path: Path, data: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        path.write_text(data, encoding="utf-8")
    else:
        path.write_bytes(data)
    return path


# -- YAML documents ------------------------------------------------------------------------------
def yaml_traps(valid: str) -> Iterator[tuple[str, bytes, bool]]:
    """(name, document, names a line?) for byte- and syntax-level traps in a valid document."""
    raw = valid.encode()
    for where, at in (("start", 0), ("middle", len(raw) // 2), ("end", len(raw) - 1)):
        yield f"nul-{where}", raw[:at] + b"\x00" + raw[at:], True
        yield f"bell-{where}", raw[:at] + b"\x07" + raw[at:], True
        yield f"latin1-{where}", raw[:at] + "é".encode("latin-1") + raw[at:], True
    yield "utf16", valid.encode("utf-16"), True
    for frac in (3, 2):
        yield f"truncated-1/{frac}", raw[: len(raw) // frac] + b"\n  - [unclosed", True
    yield "unclosed-quote", raw + b'\nextra: "never closed\n', True
    yield "tab-indent", raw + b"\nnested:\n\t- x\n", True
    yield "mapping-in-scalar", raw + b"\nkey: value: more\n", True
    yield "duplicate-key", raw + b"\n" + raw.split(b"\n", 4)[3] + b"\n", True
    yield "undefined-alias", raw + b"\nextra: *nowhere\n", True
    yield "recursive-alias", raw + b"\nextra: &loop [*loop]\n", True
    yield "merge-key", raw + b"\nbase: &b {a: 1}\nextra:\n  <<: *b\n", True
    yield "python-tag", raw + b'\nextra: !!python/object/apply:os.system ["true"]\n', True
    yield "binary-tag", raw + b"\nextra: !!binary aGVsbG8=\n", True
    yield "set-tag", raw + b"\nextra: !!set {a, b}\n", True
    yield "two-documents", raw + b"\n---\nmatrix_version: 1\n", True
    yield "complex-key", raw + b"\n? [a, b]\n: 1\n", True
    yield "yaml11-bool", raw + b"\nextra: [on, off]\n", True
    yield "empty", b"", True
    yield "comments-only", b"# nothing here\n# at all\n", True
    yield "scalar-document", b"just a string\n", True
    yield "list-document", b"- 1\n- 2\n", True
    yield "huge-int", raw + b"\nextra: " + b"9" * 5000 + b"\n", True
    for depth in (40, 3000, 100_000):
        yield f"deep-flow-{depth}", raw + b"\nextra: " + b"[" * depth + b"]" * depth + b"\n", True
    block = b"".join(b"  " * i + b"k:\n" for i in range(60)) + b"  " * 60 + b"k: 1\n"
    yield "deep-block-60", raw + b"\n" + block, True
    yield "many-items", raw + b"\nextra: [" + b",".join([b"1"] * 20_000) + b"]\n", True
    yield "oversized", raw + b"\n# " + b"x" * (1 << 21) + b"\n", False


def alias_bomb(levels: int, width: int = 9) -> str:
    """The billion-laughs family: level i is ``width`` aliases to level i-1 (9**levels values)."""
    lines = ['lol0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"lol{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


#: matrix_version spellings that are not the integer 1 written plainly (issue 15: 0x1 and 0_1).
VERSIONS = ("0x1", "0o1", "0b1", "0_1", "01", "1_0", "1:0", '"1"', "1.0", "true", "null", "[1]",
            "{a: 1}", "2", "-1", "1e400", ".inf", ".nan", "9" * 5000, "+1_000")  # fmt: skip
#: A wrong type for every key: each replaces the value of one top-level key in turn.
WRONG_VALUES = ("42", '"text"', "{a: 1}", "null", "[[1]]", "3.5", "true")


def config_cases() -> Iterator[Case]:
    valid = SMALL_CONFIG.read_text()

    def config(doc: bytes | str, line: bool) -> Callable[[Path], Call]:
        def build(root: Path) -> Call:
            path = _write(root / "matrix.yaml", doc)
            return Call(["list", "--config", str(path), "--ops-path", str(TOY_OPS)], path, line)

        return build

    doc: bytes | str
    for name, doc, line in yaml_traps(valid):
        yield Case(f"config/{name}", config(doc, line), (CONFIG,))
    for levels in range(1, 13):
        yield Case(f"config/alias-bomb-{levels}", config(valid + alias_bomb(levels), True), (CONFIG,))
    for spelling in VERSIONS:
        doc = valid.replace("matrix_version: 1", f"matrix_version: {spelling}")
        yield Case(f"config/version={spelling[:12]}", config(doc, True), (CONFIG,))
    keys = [ln.split(":", 1)[0] for ln in valid.splitlines() if ln and ln[0].isalpha() and ":" in ln]
    for key in keys:
        for value in WRONG_VALUES:
            doc = _replace_value(valid, key, value)
            yield Case(f"config/{key}={value}", config(doc, True), (CONFIG,))
    for name, build in file_traps("matrix.yaml"):
        yield Case(
            f"config/file-{name}", _with_file(build, lambda p: ["list", "--config", str(p)]), (CONFIG,)
        )


def _replace_value(doc: str, key: str, value: str) -> str:
    """``doc`` with top-level ``key``'s value (and its indented block) replaced by ``value``."""
    out, skipping = [], False
    for line in doc.splitlines():
        if line.startswith(f"{key}:"):
            out.append(f"{key}: {value}")
            skipping = True
            continue
        if skipping and (line.startswith((" ", "\t")) or not line.strip()):
            continue
        skipping = False
        out.append(line)
    return "\n".join(out) + "\n"


def file_traps(name: str) -> Iterator[tuple[str, Callable[[Path], Path]]]:
    """Paths that are not a readable regular file: each builder returns the path to hand over."""

    def fifo(root: Path) -> Path:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(path)
        return path

    def link(target: str) -> Callable[[Path], Path]:
        def build(root: Path) -> Path:
            path = root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.symlink_to(target)
            return path

        return build

    def directory(root: Path) -> Path:
        (root / name).mkdir(parents=True)
        return root / name

    yield "fifo", fifo
    yield "dev-zero", link("/dev/zero")
    yield "dev-urandom", link("/dev/urandom")
    yield "dangling-link", link("/nonexistent/opgate")
    yield "self-link", link(name)
    yield "directory", directory
    yield "missing", lambda root: root / "no" / name


def _with_file(make: Callable[[Path], Path], argv: Callable[[Path], list[str]]) -> Callable[[Path], Call]:
    def build(root: Path) -> Call:
        path = make(root)
        return Call(argv(path), path)

    return build


# -- op specs ------------------------------------------------------------------------------------
SPEC_MUTATIONS = {
    "spec_version-hex": ("spec_version: 1", "spec_version: 0x1"),
    "cost-overflow": ('flops: "M * N"', 'flops: "(9 ** 60) ** 60"'),
    "cost-huge-literal": ('flops: "M * N"', 'flops: "1e999 * M"'),
    "cost-call": ('flops: "M * N"', "flops: \"__import__('os').system('true')\""),
    "cost-attribute": ('flops: "M * N"', 'flops: "M.real"'),
    "cost-lambda": ('flops: "M * N"', 'flops: "(lambda: 1)()"'),
    "cost-syntax": ('flops: "M * N"', 'flops: "M *"'),
    "cost-unknown-symbol": ('flops: "M * N"', 'flops: "Q * N"'),
    "cost-deep": ('flops: "M * N"', 'flops: "' + "(" * 400 + "M" + ")" * 400 + '"'),
    "cost-long": ('flops: "M * N"', 'flops: "' + " + ".join(["M"] * 400) + '"'),
    "cost-complex": ('flops: "M * N"', 'flops: "(0 - M) ** 0.5"'),
    "cost-divzero": ('flops: "M * N"', 'flops: "M / (N - N)"'),
    "cost-exponent": ('flops: "M * N"', 'flops: "M ** 1000"'),
    "shape-negative": ("default: [[4, 8]]", "default: [[-4, 8]]"),
    "shape-string": ("default: [[4, 8]]", 'default: [["4", 8]]'),
    "shape-huge": ("default: [[4, 8]]", "default: [[" + "9" * 200 + ", 8]]"),
    "shape-empty": ("default: [[4, 8]]", "default: []"),
    "tolerance-nan": ("k: 2.0", "k: .nan"),
    "tolerance-inf": ("k: 2.0", "k: .inf"),
    "tolerance-string": ("k: 2.0", 'k: "2"'),
    "dtypes-unknown": ("dtypes: [fp32, fp16]", "dtypes: [fp32, fp8]"),
    "modes-bool": ("modes: [eager, compile, cudagraphs, build]", "modes: [on]"),
    "impls-list": ("implementations:\n", "implementations: [1]\nunused:\n"),
    "copies-octal": ("copies_allowed: 0", "copies_allowed: 010"),
    "op-name": ("op: toy", "op: Toy-Op"),
    "reference-bad": ("reference: toy_ref:reference", "reference: toy_ref"),
}


def spec_cases() -> Iterator[Case]:
    valid = (TOY_OPS / "toy" / "spec.yaml").read_text()

    def spec(doc: bytes | str, line: bool) -> Callable[[Path], Call]:
        def build(root: Path) -> Call:
            ops = root / "ops"
            path = _write(ops / "toy" / "spec.yaml", doc)
            for extra in ("toy.cu",):
                _write(ops / "toy" / extra, (TOY_OPS / "toy" / extra).read_bytes())
            _write(ops / "toy_ref.py", (TOY_OPS / "toy_ref.py").read_bytes())
            return Call(["list", "--config", str(SMALL_CONFIG), "--ops-path", str(ops)], path.resolve(), line)

        return build

    for name, doc, line in yaml_traps(valid):
        if not name.startswith(("nul-end", "bell-end", "latin1-end")):  # same as -middle for a spec
            yield Case(f"spec/{name}", spec(doc, line), (CONFIG,))
    for levels in (1, 5, 9, 12):
        yield Case(f"spec/alias-bomb-{levels}", spec(valid + alias_bomb(levels), True), (CONFIG,))
    for name, (old, new) in SPEC_MUTATIONS.items():
        assert old in valid, name
        yield Case(f"spec/{name}", spec(valid.replace(old, new, 1), True), (CONFIG,))
        if name.startswith("cost-"):  # the inventory evaluates cost expressions too
            yield Case(f"inventory/{name}", _inventory(spec(valid.replace(old, new, 1), True)), (CONFIG,))


def _inventory(listing: Callable[[Path], Call]) -> Callable[[Path], Call]:
    def build(root: Path) -> Call:
        call = listing(root)
        ops = call.argv[call.argv.index("--ops-path") + 1]
        return Call(["inventory", "--ops-path", ops], call.names, call.line)

    return build
