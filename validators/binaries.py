"""Which GPU code a binary really holds, read with ``cuobjdump``.

Why: "built for sm_90" is a claim in a build script; the SASS inside the .so or
cubin is the fact.  A library that holds sm_80 SASS only still imports and runs
on an H200 — by JIT-compiling PTX, or not at all — so opgate lists the ELF
(SASS) and PTX entries of every binary and compares them to the arch policy.

``cuobjdump --list-elf x.so`` prints ``ELF file    1: x.1.sm_80.cubin``;
``--list-ptx`` prints ``PTX file    1: x.1.sm_80.ptx`` (the PTX's virtual arch,
reported here as ``compute_80``).  A host-only file makes cuobjdump say
"does not contain device code".
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable, Sequence
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
        [str(cuobjdump), flag, str(path)], capture_output=True, text=True, timeout=120, check=False
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


def kernels_by_arch(path: Path, cuobjdump: Path | None = None) -> dict[str, list[str]]:
    """Kernel (function) names in each SASS arch of ``path``, from ``--dump-resource-usage``."""
    tool = cuobjdump or cuobjdump_path()
    out = _run(tool, "--dump-resource-usage", path)
    single = list_arches(path, tool).sass if "arch = " not in out else ()
    result: dict[str, list[str]] = {}
    arch = single[0] if single else "unknown"
    for raw in out.splitlines():
        line = raw.strip()
        if line.startswith("arch = "):
            arch = line.split("=", 1)[1].strip()
        elif line.startswith("Function ") and line.endswith(":"):
            result.setdefault(arch, []).append(line[len("Function ") : -1])
    return result


def gpu_sass_report(binary: Path, capability: tuple[int, int] | None = None) -> dict[str, object]:
    """On a GPU: does ``binary`` hold SASS for this device, or will the driver JIT its PTX?

    ``capability`` defaults to the current CUDA device's.  Every kernel that has
    no SASS for the device is listed under ``kernels_without_sass`` (they run
    only through PTX JIT — or not at all when there is no usable PTX either).
    """
    if capability is None:
        import torch

        capability = tuple(torch.cuda.get_device_capability())  # type: ignore[assignment]
    assert capability is not None
    found = list_arches(binary)
    by_arch = kernels_by_arch(binary) if found.has_device_code else {}
    native = {k for a, ks in by_arch.items() if sass_runs_on(a, capability) for k in ks}
    every = sorted({k for ks in by_arch.values() for k in ks})
    ptx_ok = [p for p in found.ptx if int(p.split("_")[1].rstrip("af")) <= capability[0] * 10 + capability[1]]
    missing = [k for k in every if k not in native]
    return {
        "binary": str(binary),
        "capability": f"{capability[0]}.{capability[1]}",
        "device_arch": f"sm_{capability[0]}{capability[1]}",
        "sass": list(found.sass),
        "ptx": list(found.ptx),
        "native": bool(every) and not missing,
        "jit_from_ptx": bool(missing) and bool(ptx_ok),
        "kernels_without_sass": missing,
        "listing": found.listing,
    }
