"""The op spec schema (``ops/SPEC.md``) as data: what keys exist, their types and ranges.

Kept apart from :mod:`matrix.spec` (discovery, cross-key checks, the typed view)
so each reads in one sitting.  Validated with the matrix config's schema
machinery, so a mistake is reported as ``file:line`` with a "did you mean".
"""

from __future__ import annotations

from pathlib import Path

from opgate import ops
from opgate.matrix import cost
from opgate.matrix.cell import ARCHES, DTYPES, IMPLS, LAYOUTS, MODES
from opgate.matrix.schema import Bool, Enum, Field, Float, Glob, Int, ListOf, MapOf, Record, Str

SPEC_VERSION = 1
#: opgate's own op specs (``opgate.ops.*``, importable wherever opgate is installed).
OPS_DIR = Path(ops.__file__).resolve().parent
OP_CATEGORIES = ("norm", "activation", "attention", "position", "gemm", "other")
DEVICE_KINDS = ("cpu", "cuda")
NAME_PATTERN = r"[a-z][a-z0-9_]*"
#: Implementation name of opgate's environment controls (the op's reference run through a mode,
#: see validators/controls.py): reserved, a spec may not name an implementation so.
CONTROL_IMPL = "control"
REF_PATTERN = r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*"
REF_HINT = "write module:attribute, e.g. my_ops.rms_norm.reference:rms_norm"
DIST_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]*"
#: A relative path glob inside a distribution; ``{cuda_major}``/``{cuda_minor}`` name the cell's CUDA.
FILE_GLOB = r"[^/\s][^\s]*"


#: A glob over profiler event or kernel names.  Inner spaces are allowed: demangled CUDA C++
#: kernel names have them (``kDequantizeBlockwise<float, 8, 0>``); ``a|b`` is either alternative.
EVENT_PATTERN = Str(
    "a glob over profiler event or kernel names",
    r"\S(?:.*\S)?",
    "no leading or trailing spaces; e.g. '_rms_norm_fwd_kernel*' or 'kDequantizeBlockwise<float, 8, 0>'",
)
RULE = Record("evidence rule", {"expect": ListOf(EVENT_PATTERN), "forbid": ListOf(EVENT_PATTERN)})
DEVICE_RULES = {"cpu": RULE, "cuda": RULE}
TOLERANCE_FIELDS = {"k": Float(0.0, strict=True), "atol_floor": Float(0.0)}
IMPL_SCHEMA = Record(
    "implementation",
    {
        "kind": Field(Enum(IMPLS, "implementation kind"), required=True),
        "module": Str("a module name", r"[A-Za-z_][\w.]*"),
        "entry": Field(Str("a module:attribute reference", REF_PATTERN, REF_HINT), required=True),
        "qualname": Str("a torch.library name ns::name", r"[A-Za-z_]\w*::[A-Za-z_]\w*(\.\w+)?"),
        "evidence": Field(
            Record(
                "evidence",
                {**DEVICE_RULES, "modes": MapOf(Enum(MODES, "mode"), Record("evidence", DEVICE_RULES))},
            ),
            required=True,
        ),
        "sources": ListOf(Str("a path relative to the spec"), min_len=1),
        "libraries": ListOf(
            Record(
                "library",
                {
                    "name": Field(Str("a library name", r"[A-Za-z_]\w*"), required=True),
                    "sources": Field(ListOf(Str("a path relative to the spec"), min_len=1), required=True),
                },
            ),
            min_len=1,
        ),
        "arch_policy": Record(
            "arch policy", {"sass": ListOf(Enum(ARCHES[1:], "GPU arch"), unique=True), "ptx": Bool()}
        ),
        "requires": ListOf(Str("a distribution name", DIST_PATTERN)),
        "binaries": Record(
            "binaries",
            {
                "files": ListOf(Str("a glob relative to the installed distribution", FILE_GLOB), min_len=1),
                "distribution": Str("a distribution name", DIST_PATTERN),
                "loaded": Bool(),
                "triton": Bool(),
            },
        ),
        "dtypes": ListOf(Enum(DTYPES, "dtype"), min_len=1, unique=True),
        "layouts": ListOf(Enum(LAYOUTS, "layout"), min_len=1, unique=True),
        "modes": ListOf(Enum(MODES, "mode"), min_len=1, unique=True),
        "unsupported": ListOf(
            Record(
                "unsupported", {"match": Field(Glob(), required=True), "reason": Field(Str(), required=True)}
            )
        ),
        "tolerance": Record("tolerance", TOLERANCE_FIELDS),
        "copies_allowed": Int(minimum=0),
        "mutates": Record(
            "mutates",
            {
                "inputs": ListOf(Int(minimum=0), unique=True),
                "grad_outputs": ListOf(Int(minimum=0), unique=True),
            },
        ),
    },
)
SHAPE = ListOf(Int(minimum=0), min_len=1)
SPEC_SCHEMA = Record(
    "op spec",
    {
        "spec_version": Field(Int(choices=(SPEC_VERSION,)), required=True),
        "op": Field(Str("an op name [a-z][a-z0-9_]*", NAME_PATTERN), required=True),
        "summary": Field(Str(), required=True),
        "category": Field(Enum(OP_CATEGORIES, "category"), required=True),
        "reference": Field(Str("a module:attribute reference", REF_PATTERN, REF_HINT), required=True),
        "samples": Field(Str("a module:attribute reference", REF_PATTERN, REF_HINT), required=True),
        "shapes": Field(
            MapOf(Str("a shape set name", NAME_PATTERN), ListOf(SHAPE, min_len=1)), required=True
        ),
        "cost": Record(
            "cost",
            {
                **{
                    k: Field(Str("an arithmetic expression", check=cost.check), True)
                    for k in ("bytes", "flops")
                },
                **{
                    k: Str("an arithmetic expression", check=cost.check)
                    for k in ("backward_bytes", "backward_flops")
                },
                # a symbol is a name, so N (a YAML 1.1 boolean word) is a symbol here, quoted or not
                "symbols": ListOf(
                    Str("a shape symbol", r"[A-Z][A-Za-z0-9_]*", words=True), min_len=1, unique=True
                ),
            },
        ),
        "dtypes": Field(ListOf(Enum(DTYPES, "dtype"), min_len=1, unique=True), required=True),
        "layouts": Field(ListOf(Enum(LAYOUTS, "layout"), min_len=1, unique=True), required=True),
        "modes": Field(ListOf(Enum(MODES, "mode"), min_len=1, unique=True), required=True),
        "dynamic_shapes": Bool(),
        "fused": Bool(),
        # files the op's code reads at run time (tables, configs, blobs): in its digest and --changed-since
        "data": ListOf(Str("a glob relative to the spec", FILE_GLOB), min_len=1, unique=True),
        "tolerance": Field(
            Record("tolerance", {k: Field(s, True) for k, s in TOLERANCE_FIELDS.items()}), required=True
        ),
        "copies_allowed": Int(minimum=0),
        "implementations": Field(
            MapOf(Str("an implementation name [a-z][a-z0-9_]*", NAME_PATTERN), IMPL_SCHEMA, min_len=1),
            required=True,
        ),
    },
    # ``module`` names a Python import path inside an implementation; the op's group is its category.
    renamed={"module": "category"},
)
