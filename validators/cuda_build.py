"""Build opgate's CUDA C++ ops with ``torch.utils.cpp_extension.load``, cached per build key.

Why a cache of our own: a cold sm_80+sm_90 build of a torch extension takes
a minute or more, and the matrix asks for the same binary from many cells (the
build cell, then every eager/compile cell).  The key is (torch version, torch's
CUDA, nvcc release, arch list, hash of every source and header), each key gets
its own ``build_directory`` (cpp_extension's default folder is keyed on Python
and CUDA only), and a finished build leaves ``opgate-build.json`` with the
library's sha256 — so a second run neither recompiles nor even runs ninja.

The build runs in a child interpreter: cpp_extension reads ``CUDA_HOME`` and
``TORCH_CUDA_ARCH_LIST`` from the environment and loads what it built, and a
build-only cell must not register ops in the worker (nor inherit another
cell's toolkit).  :func:`load_library` loads a built library into this process.

The payload (``ops/``) imports none of the stages: importing
``opgate.validators`` hands this module to :mod:`opgate.ops._extension`
(:func:`install`), through which the CUDA ops and the launch replay ask for
their libraries.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO

from opgate import ops
from opgate.matrix.sources import cuda_dependencies
from opgate.ops import _extension
from opgate.ops._extension import CudaBuildUnsupported
from opgate.validators.toolchain import Toolchain, ensure_nvcc, find_toolchain, nvcc_release

#: Headers shared by every opgate CUDA op (on the include path of each build).
SHARED_INCLUDE = Path(ops.__file__).resolve().parent / "_cuda"
#: Flags are part of the key too: changing them must rebuild.
EXTRA_CFLAGS = ("-O3",)
EXTRA_CUDA_CFLAGS = ("-O3",)
MARKER = "opgate-build.json"
#: Set for the workers of a run with GPUs (by the runner): build cells build the C++ libraries
#: specs declare (``implementations.*.libraries``), which only GPU cells load.
LIBRARIES_VARIABLE = "OPGATE_BUILD_LIBRARIES"


__all__ = ["CudaBuildUnsupported", "install"]


class CudaBuildError(Exception):
    """The compiler or linker failed; the message ends with the build log's tail."""


@dataclass
class BuiltExtension:
    """A finished build: where the library is and how it got there."""

    name: str
    library: Path
    build_dir: Path
    key: dict[str, str]
    cache_hit: bool
    build_s: float
    log: Path

    def to_json(self) -> dict[str, object]:
        d = asdict(self)
        d.update(library=str(self.library), build_dir=str(self.build_dir), log=str(self.log))
        return d


def arch_list(sass: Sequence[str], ptx: bool) -> str:
    """``["sm_80", "sm_90"], ptx=True`` -> ``"8.0;9.0+PTX"`` (TORCH_CUDA_ARCH_LIST syntax)."""
    if not sass:
        raise ValueError("arch policy lists no sass arch")
    items = []
    for arch in sass:
        digits = arch.removeprefix("sm_").rstrip("af")
        if not digits.isdigit() or len(digits) < 2:
            raise ValueError(f"bad arch {arch!r}: expected sm_XY, e.g. sm_90")
        items.append(f"{digits[:-1]}.{digits[-1]}")
    if ptx:
        items[-1] += "+PTX"
    return ";".join(items)


def source_hash(sources: Sequence[Path]) -> str:
    """sha256 over every source and header the build reads, plus the flags.

    The sources' folders and ops/_cuda, and every ``#include "..."`` followed
    from them (:func:`opgate.matrix.sources.cuda_dependencies`: a header in a
    subfolder changes the key too, where a stale build was reused before).
    """
    for src in sources:
        if not src.is_file():
            raise FileNotFoundError(f"CUDA source {src} does not exist")
    files, _ = cuda_dependencies([src.resolve() for src in sources])
    h = hashlib.sha256()
    for f in sorted(files):
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    h.update(repr((EXTRA_CFLAGS, EXTRA_CUDA_CFLAGS)).encode())
    return h.hexdigest()


def torch_cuda_problem(toolchain: Toolchain) -> str | None:
    """Why this torch cannot take a CUDA extension built by ``toolchain`` (None when it can)."""
    import torch

    if torch.version.cuda is None:
        return (
            f"torch {torch.__version__} is a CPU-only build (torch.version.cuda is None): it ships no "
            "CUDA headers config or libtorch_cuda, so cpp_extension cannot build a CUDA extension for it"
        )
    torch_major = int(torch.version.cuda.split(".")[0])
    if torch_major != toolchain.major:
        return (
            f"torch {torch.__version__} is built for CUDA {torch.version.cuda}, nvcc is {toolchain.release}: "
            "an extension must use the CUDA major version torch was built with"
        )
    return None


def cache_root() -> Path:
    """``$OPGATE_BUILD_CACHE``, else the user cache's ``builds`` (never site-packages)."""
    from opgate.validators.cache import user_cache_dir

    env = os.environ.get("OPGATE_BUILD_CACHE")
    return Path(env) if env else user_cache_dir() / "builds"


def _what_key(name: str, sources: Sequence[Path], sass: Sequence[str], ptx: bool) -> dict[str, str]:
    """The part of a build key that says what is built, known without torch or a toolchain."""
    return {"name": name, "arch_list": arch_list(sass, ptx), "sources": source_hash(sources)}


def build_key(
    name: str, sources: Sequence[Path], sass: Sequence[str], ptx: bool, tc: Toolchain
) -> dict[str, str]:
    import torch

    return {
        **_what_key(name, sources, sass, ptx),
        "torch": torch.__version__,
        "torch_cuda": str(torch.version.cuda),
        "nvcc": tc.release,
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
    }


def _key_dir(key: dict[str, str]) -> str:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    arches = key["arch_list"].replace(";", "_").replace(".", "").replace("+", "")
    return f"{key['name']}-pt{key['torch'].split('+')[0]}-cu{key['nvcc']}-{arches}-{digest}"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _cached(build_dir: Path, key: dict[str, str]) -> Path | None:
    marker = build_dir / MARKER
    if not marker.is_file():
        return None
    data = json.loads(marker.read_text())
    lib = Path(data.get("library", ""))
    if data.get("key") != key or not lib.is_file() or _sha256(lib) != data.get("sha256"):
        return None
    return lib


#: Seconds this process has spent in :func:`build`: its own nvcc and cache look-ups
#: (``BUILD_SECONDS``), and blocked on a key's lock while another process's nvcc built it
#: (``BUILD_WAIT_SECONDS``).  A cell's set-up reads the differences: the run breakdown counts
#: the first as build work and the wait as the harness's (a lane that waits builds nothing:
#: on the H200 five GPU lanes once waited 23 s each for one library one lane was building).
BUILD_SECONDS = [0.0]
BUILD_WAIT_SECONDS = [0.0]


class BuildBusy(Exception):
    """``build(wait=False)``: another process holds this key's lock (it is building it now)."""


def build(
    name: str,
    sources: Sequence[Path],
    sass: Sequence[str],
    ptx: bool,
    toolchain: Toolchain,
    *,
    root: Path | None = None,
    timeout_s: float = 1800,
    wait: bool = True,
) -> BuiltExtension:
    """Build (or reuse) extension ``name`` from ``sources`` for the arch policy with ``toolchain``.

    Raises :class:`CudaBuildUnsupported` (CPU-only torch, CUDA major mismatch)
    before compiling anything, :class:`CudaBuildError` when compilation fails.
    ``wait=False``: raise :class:`BuildBusy` instead of waiting while another
    process builds the same key (a build cell that only starts a shared
    library early has nothing to add to a build under way).
    """
    problem = torch_cuda_problem(toolchain)
    if problem:
        raise CudaBuildUnsupported(problem)
    sources = [Path(s).resolve() for s in sources]
    key = build_key(name, sources, sass, ptx, toolchain)
    build_dir = (root or cache_root()) / _key_dir(key)
    build_dir.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    waited = [0.0]
    try:
        return _build_locked(name, sources, build_dir, key, toolchain, timeout_s, start, waited, wait)
    finally:
        BUILD_WAIT_SECONDS[0] += waited[0]
        BUILD_SECONDS[0] += time.monotonic() - start - waited[0]


def _lock(lock: IO[str], waited: list[float], wait: bool) -> None:
    """Take the key's lock; ``waited`` gets the seconds spent blocked on another process's build."""
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        if not wait:
            raise BuildBusy(f"{lock.name}: another process is building this key") from None
    t = time.monotonic()
    fcntl.flock(lock, fcntl.LOCK_EX)
    waited[0] = time.monotonic() - t


def _build_locked(  # noqa: PLR0917 - build()'s own state, split off to time it whole
    name: str,
    sources: Sequence[Path],
    build_dir: Path,
    key: dict[str, str],
    toolchain: Toolchain,
    timeout_s: float,
    start: float,
    waited: list[float],
    wait: bool,
) -> BuiltExtension:
    log = build_dir / "build.log"
    with (build_dir / ".lock").open("w") as lock:
        _lock(lock, waited, wait)
        lib = _cached(build_dir, key)
        if lib is not None:
            return BuiltExtension(name, lib, build_dir, key, True, time.monotonic() - start, log)
        env = {
            **os.environ,
            "CUDA_HOME": str(toolchain.cuda_home),
            "PATH": f"{toolchain.nvcc.parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "TORCH_CUDA_ARCH_LIST": key["arch_list"],
            "MAX_JOBS": os.environ.get("MAX_JOBS", str(os.cpu_count() or 1)),
        }
        request = {"name": name, "sources": [str(s) for s in sources], "build_dir": str(build_dir)}
        cmd = [sys.executable, "-m", "opgate.validators.cuda_build", json.dumps(request)]
        try:
            proc = subprocess.run(
                cmd, env=env, cwd=build_dir, capture_output=True, text=True, timeout=timeout_s, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise CudaBuildError(f"build of {name} exceeded {timeout_s:.0f} s") from exc
        log.write_text(proc.stdout + proc.stderr)
        lib = build_dir / f"{name}.so"
        if proc.returncode != 0 or not lib.is_file():
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-25:])
            raise CudaBuildError(f"build of {name} with nvcc {toolchain.release} failed (log {log}):\n{tail}")
        seconds = time.monotonic() - start
        marker = {"key": key, "library": str(lib), "sha256": _sha256(lib), "build_s": round(seconds, 2)}
        (build_dir / MARKER).write_text(json.dumps(marker, indent=1) + "\n")
        return BuiltExtension(name, lib, build_dir, key, False, seconds, log)


def looks_built(
    name: str, sources: Sequence[Path], sass: Sequence[str], ptx: bool, torch: str | None
) -> bool:
    """Whether a finished build of this library for ``torch`` is in the cache, looked at without torch.

    The run's planner asks it (it imports no torch): a GPU cell need not wait
    for a build cell whose library is already built.  It matches the name,
    the sources' hash, the arch list and torch's version; the nvcc release and
    Python are not known here, so a match is likely, not certain (a wrong
    "built" costs a lock wait, counted as such; a wrong "not built" a wait for
    the build cell).
    """
    try:
        want = _what_key(name, [Path(s).resolve() for s in sources], sass, ptx)
    except (OSError, ValueError):
        return False
    for marker in cache_root().glob(f"{name}-*/{MARKER}"):
        try:
            key = json.loads(marker.read_text())["key"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if all(key.get(k) == v for k, v in want.items()) and (torch is None or key.get("torch") == torch):
            return True
    return False


def cached_library(
    name: str, sources: Sequence[Path], sass: Sequence[str], ptx: bool, toolchain: Toolchain
) -> Path | None:
    """The finished build of this key, if there is one (no lock, no compiler: a quick look)."""
    key = build_key(name, [Path(s).resolve() for s in sources], sass, ptx, toolchain)
    return _cached(cache_root() / _key_dir(key), key)


def default_toolchain(*, install: bool = True) -> Toolchain:
    """The nvcc for runtime use: ``$OPGATE_CUDA_VERSION``, else torch's CUDA, else any same-major nvcc.

    ``install=False``: only look (an optional accelerator must not download a toolkit at import).
    """
    import torch

    wanted = os.environ.get("OPGATE_CUDA_VERSION") or torch.version.cuda
    if wanted is None:
        raise CudaBuildUnsupported(
            f"torch {torch.__version__} is a CPU-only build; no CUDA extension can load"
        )
    version = ".".join(wanted.split(".")[:2])
    found = find_toolchain(version)
    if found is not None:
        return found
    on_path = shutil.which("nvcc")
    release = nvcc_release(Path(on_path)) if on_path else None
    if release and release.split(".")[0] == version.split(".")[0]:
        same_major = find_toolchain(".".join(release.split(".")[:2]))
        if same_major is not None:
            return same_major
    if not install:
        raise CudaBuildUnsupported(f"no nvcc {version} (or same major) found on this machine")
    return ensure_nvcc(version)


_LOADED: dict[str, Path] = {}


def load_library(
    name: str, sources: Sequence[Path], sass: Sequence[str], ptx: bool = False, *, install: bool = True
) -> BuiltExtension:
    """Build (cached) with :func:`default_toolchain` and load the ops into this process once."""
    import torch

    built = build(name, sources, sass, ptx, default_toolchain(install=install))
    if name not in _LOADED:
        torch.ops.load_library(str(built.library))
        _LOADED[name] = built.library
    elif _LOADED[name] != built.library:
        raise RuntimeError(f"{name}: {_LOADED[name]} is already loaded; cannot also load {built.library}")
    return built


def library_name(op: str, impl: str) -> str:
    """The library a CUDA implementation builds to, for the build check and the runtime alike."""
    return f"opgate_{op}_{impl}"


def load_for_spec(module_name: str) -> BuiltExtension:
    """Build (cached) and load the library of the implementation whose spec ``module`` is ``module_name``.

    What to build comes from the spec next to the module, the one place it is
    declared: ``sources`` and ``arch_policy`` (``sass``, ``ptx``) of the
    implementation that names this module, so the binary the runtime loads is
    the one the build cells inspect.
    """
    from opgate.matrix.spec import load_spec

    module_file = getattr(sys.modules.get(module_name), "__file__", None)
    if module_file is None:
        raise ValueError(f"{module_name} is not an imported module with a file")
    spec_path = Path(module_file).resolve().parent / "spec.yaml"
    spec = load_spec(spec_path, None)
    impls = [i for i in spec.implementations.values() if i.kind == "cuda" and i.module == module_name]
    if len(impls) != 1:
        raise ValueError(f"{spec_path}: expected one cuda implementation with module {module_name}")
    impl = impls[0]
    return load_library(library_name(spec.op, impl.name), impl.sources, impl.sass, impl.ptx)


class _Builder:
    """This module as the payload's :class:`opgate.ops._extension.Builder`."""

    def load_for_spec(self, module_name: str) -> BuiltExtension:
        return load_for_spec(module_name)

    def load_library(
        self,
        name: str,
        sources: Sequence[Path],
        sass: Sequence[str],
        ptx: bool = False,
        *,
        install: bool = True,
    ) -> BuiltExtension:
        return load_library(name, sources, sass, ptx, install=install)

    def cached_library(
        self, name: str, sources: Sequence[Path], sass: Sequence[str], ptx: bool
    ) -> Path | None:
        return cached_library(name, sources, sass, ptx, default_toolchain(install=False))


def install() -> None:
    """Hand this builder to the payload (``opgate.validators`` does it on import)."""
    _extension.install(_Builder())


def _child(request_json: str) -> int:
    """Runs in the child interpreter: one cpp_extension.load, environment already set."""
    from torch.utils import cpp_extension

    req = json.loads(request_json)
    cpp_extension.load(
        name=req["name"],
        sources=req["sources"],
        extra_cflags=list(EXTRA_CFLAGS),
        extra_cuda_cflags=list(EXTRA_CUDA_CFLAGS),
        build_directory=req["build_dir"],
        extra_include_paths=[str(SHARED_INCLUDE)],
        is_python_module=False,
        with_cuda=True,
        verbose=True,
    )
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="opgate CUDA extension build (child process)")
    parser.add_argument("request", help="JSON: name, sources, build_dir")
    sys.exit(_child(parser.parse_args().request))
