"""Which GPU code a binary really holds, read with ``cuobjdump``.

Why: "built for sm_90" is a claim in a build script; the SASS inside the .so or
cubin is the fact.  A library that holds sm_80 SASS only still imports and runs
on an H200 — by JIT-compiling PTX, or not at all — so opgate lists the ELF
(SASS) and PTX entries of every binary and compares them to the arch policy.

``cuobjdump --list-elf x.so`` prints ``ELF file    1: x.1.sm_80.cubin``;
``--list-ptx`` prints ``PTX file    1: x.1.sm_80.ptx`` (the PTX's virtual arch,
reported here as ``compute_80``).  A host-only file makes cuobjdump say
"does not contain device code".

Every call passes ``-all``: without it cuobjdump reads only the first
fatbin of a file, and a library linked from many translation units (a
prebuilt wheel's ``.so``) holds one fatbin per unit; its PTX often sits in
none but the later ones (bitsandbytes' ``libbitsandbytes_cuda130.so``: 7 cubins
and no PTX without ``-all``, 49 cubins and 6 ``compute_120`` PTX with it).

A *kernel* is an entry function, one with a parameter constant bank
(``CONSTANT[0]`` in ``--dump-resource-usage``).  Device functions the
compiler kept out of line (``__cuda_sm70_shflsync_idx_p``,
``__cuda_sm70_warpsync``, a ``__noinline__`` helper) have none: they cannot be
launched, so they are never "a kernel without SASS".
"""

from __future__ import annotations

import fnmatch
import functools
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from opgate.validators.toolchain import cuobjdump_path

_ENTRY_RE = re.compile(r"^(ELF|PTX) file\s+\d+:\s+(\S+)\s*$", re.MULTILINE)
_ARCH_RE = re.compile(r"\bsm_(\d+)([af]?)\b")
_NO_DEVICE_CODE = "does not contain device code"


class BinaryInspectionError(RuntimeError):
    """cuobjdump could not read the file (missing, not an ELF/cubin/fatbin)."""


@dataclass(frozen=True)
class BinaryArches:
    """SASS and PTX targets found in one binary, with cuobjdump's own listing as evidence."""

    path: Path
    sass: tuple[str, ...]  # "sm_80", "sm_90a", ... sorted, unique
    ptx: tuple[str, ...]  # "compute_80", ...
    elf_files: tuple[str, ...] = ()
    ptx_files: tuple[str, ...] = ()
    listing: str = ""
    has_device_code: bool = True

    def to_json(self) -> dict[str, object]:
        return {
            "path": str(self.path),
            "sass": list(self.sass),
            "ptx": list(self.ptx),
            "elf_files": list(self.elf_files),
            "ptx_files": list(self.ptx_files),
            "has_device_code": self.has_device_code,
        }


def arch_of(entry_name: str) -> str | None:
    """``"k.2.sm_90a.cubin"`` -> ``"sm_90a"``; None when the name carries no arch."""
    found = _ARCH_RE.findall(entry_name)
    if not found:
        return None
    digits, suffix = found[-1]
    return f"sm_{digits}{suffix}"


def _sort_key(arch: str) -> tuple[int, str]:
    m = re.search(r"(\d+)([af]?)$", arch)
    return (int(m.group(1)), m.group(2)) if m else (0, arch)


def parse_listing(text: str) -> tuple[list[str], list[str]]:
    """ELF and PTX entry names from cuobjdump ``--list-elf`` / ``--list-ptx`` output."""
    elf: list[str] = []
    ptx: list[str] = []
    for kind, name in _ENTRY_RE.findall(text):
        (elf if kind == "ELF" else ptx).append(name)
    return elf, ptx


def _run(cuobjdump: Path, flag: str, path: Path) -> str:
    proc = subprocess.run(
        [str(cuobjdump), "-all", flag, str(path)], capture_output=True, text=True, timeout=300, check=False
    )
    out = proc.stdout + proc.stderr
    benign = _NO_DEVICE_CODE in out or "No PTX file found" in out
    if proc.returncode != 0 and not benign and ("fatal" in out or not path.exists()):
        raise BinaryInspectionError(f"cuobjdump {flag} {path}: {out.strip() or f'exit {proc.returncode}'}")
    return out


def list_arches(path: Path, cuobjdump: Path | None = None) -> BinaryArches:
    """Run cuobjdump ``--list-elf`` and ``--list-ptx`` on ``path`` and parse both."""
    tool = cuobjdump or cuobjdump_path()
    elf_out = _run(tool, "--list-elf", path)
    ptx_out = _run(tool, "--list-ptx", path)
    elf, ptx = parse_listing(elf_out)
    _, ptx_names = parse_listing(ptx_out)
    ptx = ptx or ptx_names
    sass = sorted({a for a in map(arch_of, elf) if a}, key=_sort_key)
    virt = sorted({a.replace("sm_", "compute_") for a in map(arch_of, ptx) if a}, key=_sort_key)
    listing = "\n".join(s for s in (elf_out.strip(), ptx_out.strip()) if s)
    return BinaryArches(
        path=path,
        sass=tuple(sass),
        ptx=tuple(virt),
        elf_files=tuple(elf),
        ptx_files=tuple(ptx),
        listing=listing,
        has_device_code=_NO_DEVICE_CODE not in elf_out,
    )


def sass_satisfies(have: str, want: str) -> bool:
    """SASS ``have`` runs on a device of arch ``want``: same sm number (``sm_90a`` counts for ``sm_90``)."""
    return have.rstrip("af") == want.rstrip("af")


def missing_arches(
    found: BinaryArches | Iterable[BinaryArches], sass: Sequence[str], ptx: Sequence[str] = ()
) -> list[str]:
    """Required entries absent from every binary: ``["sm_90", "compute_90"]``-style names."""
    binaries = [found] if isinstance(found, BinaryArches) else list(found)
    have_sass = {a for b in binaries for a in b.sass}
    have_ptx = {a for b in binaries for a in b.ptx}
    missing = [w for w in sass if not any(sass_satisfies(h, w) for h in have_sass)]
    missing += [p for p in ptx if p not in have_ptx]
    return missing


def sass_runs_on(have: str, capability: tuple[int, int]) -> bool:
    """SASS ``have`` executes on a device of ``capability`` without JIT.

    Plain ``sm_XY`` SASS runs on the same major with minor >= Y (sm_80 on an
    sm_86 card); arch-specific ``sm_XYa`` only on exactly X.Y; another major never.
    """
    m = re.fullmatch(r"sm_(\d+?)(\d)([af]?)", have)
    if not m:
        return False
    major, minor, suffix = int(m.group(1)), int(m.group(2)), m.group(3)
    if suffix:
        return (major, minor) == capability
    return major == capability[0] and minor <= capability[1]


#: Out-of-line device functions the compiler emits (never launched): named, in case a
#: cuobjdump version prints no constant bank for a kernel either.
_HELPER_PREFIXES = ("__cuda_", "__internal_", "__nv_")


def parse_resource_usage(text: str) -> dict[str, list[str]]:
    """Kernel names per SASS arch from ``cuobjdump -all --dump-resource-usage`` output.

    Only ``Fatbin elf code`` sections count (PTX sections carry an arch line
    too, but no machine code); a function counts when its resource line names
    ``CONSTANT[0]`` (an entry function's parameter bank) and its name is not a
    compiler helper.  A kernel compiled into several fatbins is listed once.
    """
    result: dict[str, list[str]] = {}
    arch, in_elf, function = "unknown", True, None
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("Fatbin "):
            in_elf = line.startswith("Fatbin elf")
        elif line.startswith("arch = "):
            arch = line.split("=", 1)[1].strip()
        elif line.startswith("Function ") and line.endswith(":"):
            function = line[len("Function ") : -1]
            continue
        elif function is not None and in_elf:
            names = result.setdefault(arch, [])
            if "CONSTANT[0]" in line and not function.startswith(_HELPER_PREFIXES) and function not in names:
                names.append(function)
        function = None
    return result


def kernels_by_arch(path: Path, cuobjdump: Path | None = None) -> dict[str, list[str]]:
    """Kernel (entry function) names in each SASS arch of ``path``; helpers are left out."""
    tool = cuobjdump or cuobjdump_path()
    out = _run(tool, "--dump-resource-usage", path)
    if "arch = " not in out:  # a lone cubin: no fatbin header, its arch is in the listing
        single = list_arches(path, tool).sass
        out = f"arch = {single[0] if single else 'unknown'}\n{out}"
    return parse_resource_usage(out)


_PTX_ENTRY_RE = re.compile(r"^\s*(?:\.visible\s+|\.weak\s+)?\.entry\s+([\w$.]+)", re.MULTILINE)


@functools.lru_cache(maxsize=32)
def _ptx_kernels(path: Path, mtime_ns: int, tool: Path) -> tuple[str, ...]:
    out = _run(tool, "--dump-ptx", path)
    return tuple(dict.fromkeys(_PTX_ENTRY_RE.findall(out)))


def ptx_kernels(path: Path, cuobjdump: Path | None = None) -> list[str]:
    """Kernel (``.entry``) names in the PTX of ``path``: what a PTX-only build can still JIT."""
    return list(_ptx_kernels(path, path.stat().st_mtime_ns, cuobjdump or cuobjdump_path()))


def demangle(names: Sequence[str]) -> dict[str, str]:
    """Mangled -> demangled C++ names (``c++filt``, as the profiler shows them); identity without it."""
    tool = shutil.which("c++filt")
    if not names or tool is None:
        return {n: n for n in names}
    proc = subprocess.run(
        [tool], input="\n".join(names) + "\n", capture_output=True, text=True, timeout=60, check=False
    )
    out = proc.stdout.splitlines()
    if proc.returncode != 0 or len(out) != len(names):
        return {n: n for n in names}
    return dict(zip(names, out, strict=True))


def matching(names: Iterable[str], patterns: Sequence[str], readable: Mapping[str, str]) -> list[str]:
    """Names whose mangled or demangled form matches one of ``patterns`` (``a|b`` = either)."""
    globs = [g for p in patterns for g in p.split("|")]
    return [
        n
        for n in names
        if any(fnmatch.fnmatchcase(n, g) or fnmatch.fnmatchcase(readable.get(n, n), g) for g in globs)
    ]


def gpu_sass_report(
    binary: Path, capability: tuple[int, int] | None = None, kernels: Sequence[str] = ()
) -> dict[str, object]:
    """On a GPU: does ``binary`` hold SASS for this device, or will the driver JIT its PTX?

    ``capability`` defaults to the current CUDA device's.  Every kernel that has
    no SASS for the device is listed under ``kernels_without_sass`` (they run
    only through PTX JIT — or not at all when there is no usable PTX either).
    ``kernels`` (glob patterns, e.g. the spec's CUDA evidence) narrows the
    judgement to the op's own kernels when any match: a library's kernels for
    other ops and other arches are reported, not judged.
    """
    if capability is None:
        import torch

        capability = tuple(torch.cuda.get_device_capability())  # type: ignore[assignment]
    assert capability is not None
    found = list_arches(binary)
    by_arch = kernels_by_arch(binary) if found.has_device_code else {}
    native = {k for a, ks in by_arch.items() if sass_runs_on(a, capability) for k in ks}
    every = sorted({k for ks in by_arch.values() for k in ks})
    if found.ptx and not every:  # a PTX-only build: its kernels are named in the PTX alone
        every = sorted(set(ptx_kernels(binary)))
    readable = demangle(every) if kernels else {}
    judged = matching(every, kernels, readable) if kernels else []
    judged = judged or every
    ptx_ok = [p for p in found.ptx if int(p.split("_")[1].rstrip("af")) <= capability[0] * 10 + capability[1]]
    missing = [k for k in judged if k not in native]
    return {
        "binary": str(binary),
        "capability": f"{capability[0]}.{capability[1]}",
        "device_arch": f"sm_{capability[0]}{capability[1]}",
        "sass": list(found.sass),
        "ptx": list(found.ptx),
        "kernels": len(every),
        "kernels_judged": len(judged),
        "native": bool(judged) and not missing,
        "jit_from_ptx": bool(missing) and bool(ptx_ok),
        "kernels_without_sass": missing,
        "listing": found.listing,
    }
