"""Child process of the build check: cross-compile one implementation's Triton kernels for one arch.

Run as ``opgate.checks.triton_build '<json request>'`` with
``TRITON_INTERPRET`` unset (under the interpreter ``@triton.jit`` yields no
compilable kernels).  Prints one JSON line: per (kernel, dtype) the cubin path
and compile time, or the error.

Kernels are the module-level ``JITFunction`` objects of the implementation
module and of the modules it holds as attributes (``from opgate.ops.x import
triton_kernels as K``).  A jit function called by another one is a helper,
not a kernel.  Each kernel needs a build signature, from a module-level
``TRITON_BUILD_SIGNATURES`` dict next to the kernels (a ``signatures`` entry
of the request, when given, comes first)::

    TRITON_BUILD_SIGNATURES = {
        "_rms_norm_fwd_kernel": {
            "signature": {"X": "*{dtype}", "W": "*{dtype}", "Y": "*{dtype}", "M": "i32", "eps": "fp32"},
            "constexprs": {"BLOCK_N": 1024, "ACC": "fp32"},
            "options": {"num_warps": 8},
        },
    }

``{dtype}`` expands to each dtype the implementation claims (fp32/fp16/bf16 are
Triton's own type names); a constexpr given as a dtype name becomes ``tl.<dtype>``.
Constexprs with a default in the kernel signature may be left out.
"""

from __future__ import annotations

import inspect
import json
import re
import sys
import time
import types
from pathlib import Path
from typing import Any

_TL_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "fp64": "float64", "i32": "int32"}


def _unwrap(obj: Any) -> Any:
    """Autotuner / Heuristics wrappers hold the JITFunction in ``.fn``."""
    from triton.runtime.jit import JITFunction

    seen = 0
    while not isinstance(obj, JITFunction) and hasattr(obj, "fn") and seen < 5:
        obj = obj.fn
        seen += 1
    return obj if isinstance(obj, JITFunction) else None


def discover(module_name: str) -> tuple[dict[str, Any], list[types.ModuleType]]:
    """Module-level jit functions of ``module_name`` and of the modules of its package it reaches.

    The implementation module usually imports a launcher or a kernels module
    (``from opgate.ops.rms_norm import triton_kernels as K``, ``from opgate.ops.rms_norm.launch
    import rms_forward``): modules, and modules of imported functions, under the
    same package are followed.  Shared helpers outside the package are not kernels.
    """
    import importlib

    package = module_name.rsplit(".", 1)[0]
    todo = [importlib.import_module(module_name)]
    modules: list[types.ModuleType] = []
    while todo:
        mod = todo.pop()
        if mod in modules:
            continue
        modules.append(mod)
        for value in vars(mod).values():
            owner = (
                value
                if isinstance(value, types.ModuleType)
                else sys.modules.get(getattr(value, "__module__", "") or "")
            )
            if owner is not None and owner.__name__.startswith(package + ".") and owner not in modules:
                todo.append(owner)
    found: dict[str, Any] = {}
    for mod in modules:
        for name, value in vars(mod).items():
            fn = _unwrap(value)
            if fn is not None and getattr(fn, "__module__", mod.__name__) == mod.__name__:
                found.setdefault(name, fn)
    return found, modules


def entry_kernels(found: dict[str, Any]) -> list[str]:
    """Jit functions no other jit function calls: the ones launched from Python."""
    sources = {n: getattr(f, "src", "") for n, f in found.items()}
    return sorted(
        n
        for n in found
        if not any(re.search(rf"\b{re.escape(n)}\s*\(", s) for m, s in sources.items() if m != n)
    )


def _variants(spec: Any) -> list[dict[str, Any]]:
    return list(spec) if isinstance(spec, list) else [spec]


def _expand(value: Any, dtype: str) -> Any:
    return value.replace("{dtype}", dtype) if isinstance(value, str) else value


def _constexpr_value(value: Any) -> Any:
    import triton.language as tl

    if isinstance(value, str) and value in _TL_DTYPES:
        return getattr(tl, _TL_DTYPES[value])
    return value


def _source(fn: Any, variant: dict[str, Any], dtype: str) -> tuple[Any, dict[str, Any]]:
    """ASTSource for ``fn`` with every parameter bound; raises ValueError naming what is missing."""
    from triton.compiler import ASTSource

    sig_in = {k: _expand(v, dtype) for k, v in (variant.get("signature") or {}).items()}
    const_in = {k: _constexpr_value(_expand(v, dtype)) for k, v in (variant.get("constexprs") or {}).items()}
    signature: dict[str, str] = {}
    constexprs: dict[str, Any] = {}
    missing = []
    for p in fn.params:
        if p.is_constexpr:
            signature[p.name] = "constexpr"
            if p.name in const_in:
                constexprs[p.name] = const_in[p.name]
            elif p.default is not inspect.Parameter.empty:
                constexprs[p.name] = p.default
            else:
                missing.append(p.name)
        elif p.name in sig_in:
            signature[p.name] = sig_in[p.name]
        else:
            missing.append(p.name)
    unknown = sorted((set(sig_in) | set(const_in)) - {p.name for p in fn.params})
    if missing or unknown:
        raise ValueError(f"build signature of {fn.__name__}: missing {missing}, unknown {unknown}")
    return ASTSource(fn=fn, signature=signature, constexprs=constexprs), dict(variant.get("options") or {})


def compile_kernel(fn: Any, variant: dict[str, Any], dtype: str, arch: str, outdir: Path) -> dict[str, Any]:
    import triton
    from triton.backends.compiler import GPUTarget

    cc = int(arch.removeprefix("sm_").rstrip("af"))
    row: dict[str, Any] = {"kernel": fn.__name__, "dtype": dtype, "arch": arch, "compile_s": 0.0}
    start = time.monotonic()
    try:
        src, options = _source(fn, variant, dtype)
        compiled = triton.compile(src, target=GPUTarget("cuda", cc, 32), options=options)
        path = outdir / f"{fn.__name__}.{dtype}.{arch}.{len(list(outdir.glob(fn.__name__ + '.*')))}.cubin"
        path.write_bytes(compiled.asm["cubin"])
        row["cubin"] = str(path)
    except Exception as exc:  # noqa: BLE001 (one kernel's failure is a row, not a crash)
        row["error"] = (
            f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
        )
    row["compile_s"] = round(time.monotonic() - start, 3)
    return row


def compile_launches(launches: list[dict[str, Any]], arch: str, outdir: Path) -> list[dict[str, Any]]:
    """Compile recorded launches (``{module, kernel, dtype, variant}``) of a library's kernels."""
    import importlib

    rows = []
    for launch in launches:
        fn = _unwrap(getattr(importlib.import_module(launch["module"]), launch["kernel"], None))
        if fn is None:
            rows.append({**launch, "error": f"{launch['module']} has no Triton kernel {launch['kernel']}"})
            continue
        row = compile_kernel(fn, launch["variant"], launch["dtype"], arch, outdir)
        rows.append(row)
    return rows


def main(request_json: str) -> dict[str, Any]:
    import triton

    req = json.loads(request_json)
    if req.get("launches") is not None:
        kernels = compile_launches(req["launches"], req["arch"], Path(req["outdir"]))
        return {"triton": triton.__version__, "kernels": kernels}
    found, modules = discover(req["module"])
    sigs: dict[str, Any] = dict(req.get("signatures") or {})
    for mod in modules:
        for k, v in (getattr(mod, "TRITON_BUILD_SIGNATURES", None) or {}).items():
            sigs.setdefault(k, v)
    report: dict[str, Any] = {"triton": triton.__version__, "kernels": [], "discovered": sorted(found)}
    entries = entry_kernels(found)
    unsigned = [k for k in entries if k not in sigs]
    if unsigned:
        report["error"] = (
            f"Triton kernels without a build signature: {', '.join(unsigned)} (add them to a "
            f"TRITON_BUILD_SIGNATURES dict in {req['module']}, as `opgate init` writes it)"
        )
        return report
    outdir = Path(req["outdir"])
    for name in entries:
        for variant in _variants(sigs[name]):
            dtypes = req["dtypes"] if "{dtype}" in json.dumps(variant) else req["dtypes"][:1]
            for dtype in dtypes:
                report["kernels"].append(compile_kernel(found[name], variant, dtype, req["arch"], outdir))
    return report


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
