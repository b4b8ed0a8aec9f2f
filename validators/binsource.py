"""Which binaries an external implementation's cells audit: the spec's ``binaries`` resolved here.

Why a spec names them: a prebuilt wheel (bitsandbytes, xformers, a vendor's
kernels) arrives with its ``.so`` files already compiled, and the arch story
("built for sm_90, runs a fallback on sm_80") is in those files, not in any
source opgate could build.  Two ways to name them:

* ``files``: globs relative to the installed distribution's root
  (``site-packages``), e.g. ``bitsandbytes/libbitsandbytes_cuda{cuda_major}{cuda_minor}.so``;
  ``{cuda_major}``/``{cuda_minor}`` become the cell's CUDA version, so the
  CUDA axis picks the library a torch of that CUDA loads;
* ``loaded``: every library of the distribution (or under the implementation
  module's package) that this process has mapped and that holds device code,
  read from ``/proc/self/maps`` — for libraries whose file names say nothing.

GPU cells ask which declared file is *mapped* (the one the op really ran),
build cells audit every declared file without a GPU.
"""

from __future__ import annotations

import fnmatch
import importlib
import importlib.metadata
import importlib.util
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: Suffixes of files that can hold device code (shared libraries, cubins, fatbins).
_DEVICE_SUFFIXES = (".so", ".cubin", ".fatbin")


class BinariesUnavailable(RuntimeError):
    """The distribution the spec names is not installed here (a ``skip`` reason)."""


def cuda_parts(cuda: str) -> dict[str, str]:
    """``"13.0"`` -> ``{"cuda_major": "13", "cuda_minor": "0"}``; ``*`` for an unknown version."""
    major, _, minor = cuda.partition(".")
    if not major.isdigit() or not minor.isdigit():
        return {"cuda_major": "*", "cuda_minor": "*"}
    return {"cuda_major": major, "cuda_minor": minor}


def distribution_root(name: str) -> tuple[Path, str]:
    """(root the distribution's files are relative to, its version); raises when not installed."""
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError as exc:
        raise BinariesUnavailable(f"distribution {name!r} is not installed here") from exc
    return Path(str(dist.locate_file(""))).resolve(), dist.version


def declared_globs(binaries: Mapping[str, Any], cuda: str | None) -> list[str]:
    """The spec's file globs with the CUDA placeholders filled (``*`` when ``cuda`` is None)."""
    parts = cuda_parts(cuda) if cuda else {"cuda_major": "*", "cuda_minor": "*"}
    return [g.format(**parts) for g in binaries.get("files") or []]


def declared_files(binaries: Mapping[str, Any], cuda: str | None) -> tuple[list[Path], str, Path]:
    """(files of the installed distribution matching the globs, its version, its root)."""
    root, version = distribution_root(binaries["distribution"])
    found: list[Path] = []
    for glob in declared_globs(binaries, cuda):
        found += [p.resolve() for p in sorted(root.glob(glob)) if p.is_file() and p.resolve() not in found]
    return found, version, root


def mapped_files(maps: Path = Path("/proc/self/maps")) -> list[Path]:
    """Every file mapped into this process (each once, in map order)."""
    seen: list[Path] = []
    try:
        text = maps.read_text()
    except OSError:
        return seen
    for line in text.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].startswith("/"):
            path = Path(fields[5].removesuffix(" (deleted)"))
            if path not in seen:
                seen.append(path)
    return seen


def _package_dirs(binaries: Mapping[str, Any], module: str) -> list[Path]:
    """Directories whose mapped libraries count as the implementation's own.

    The installed files of the distribution (its top-level import folders) and
    the folder of the implementation module's top-level package.
    """
    dirs: list[Path] = []
    if binaries.get("distribution"):
        try:
            dist = importlib.metadata.distribution(binaries["distribution"])
            root = Path(str(dist.locate_file(""))).resolve()
            tops = {Path(str(f)).parts[0] for f in dist.files or [] if len(Path(str(f)).parts) > 1}
            dirs += [root / t for t in sorted(tops) if not t.endswith((".dist-info", ".data"))]
        except importlib.metadata.PackageNotFoundError:
            pass
    spec = importlib.util.find_spec(module.split(".", maxsplit=1)[0]) if module else None
    if spec is not None and spec.submodule_search_locations:
        dirs += [Path(p).resolve() for p in spec.submodule_search_locations]
    return dirs


def _is_library(path: Path) -> bool:
    return path.name.endswith(_DEVICE_SUFFIXES) or ".so." in path.name


def loaded_binaries(
    binaries: Mapping[str, Any], module: str, maps: Path = Path("/proc/self/maps")
) -> list[Path]:
    """Declared binaries this process has mapped: glob matches, plus (``loaded``) the package's own."""
    mapped = [p.resolve() for p in mapped_files(maps) if _is_library(p)]
    chosen: list[Path] = []
    if binaries.get("files"):
        try:
            root: Path | None = distribution_root(binaries["distribution"])[0]
        except BinariesUnavailable:
            root = None
        if root is not None:
            globs = [str(root / g) for g in declared_globs(binaries, None)]
            chosen += [p for p in mapped if any(fnmatch.fnmatchcase(str(p), g) for g in globs)]
    if binaries.get("loaded"):
        dirs = _package_dirs(binaries, module)
        chosen += [p for p in mapped if any(p.is_relative_to(d) for d in dirs) and p not in chosen]
    return chosen


def main(request_json: str) -> dict[str, Any]:
    """Child process of a build cell: import the module, report what it mapped (no GPU touched)."""
    req = json.loads(request_json)
    if req.get("root") and req["root"] not in sys.path:
        sys.path.insert(0, req["root"])
    try:
        importlib.import_module(req["module"])
    except Exception as exc:  # noqa: BLE001 (reported to the parent as the cell's error)
        return {"error": f"import {req['module']}: {type(exc).__name__}: {exc}"}
    return {"loaded": [str(p) for p in loaded_binaries(req["binaries"], req["module"])]}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
