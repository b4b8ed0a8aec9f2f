"""CUDA toolchains per CUDA version: find an nvcc, or install one from PyPI into a cache.

Why: the CUDA axis of the matrix says *which* nvcc built a CUDA C++ op, so a
build cell must run the nvcc of its version and record its exact release —
never "whatever nvcc is on PATH".  Sources, first match wins:

1. ``$OPGATE_NVCC_<MAJ>_<MIN>`` (e.g. ``OPGATE_NVCC_12_9=/opt/cuda-12.9/bin/nvcc``);
2. ``nvcc`` on ``PATH``, ``/usr/local/cuda-<ver>/bin/nvcc``, ``/usr/local/cuda/bin/nvcc``;
3. a toolkit opgate installed from PyPI wheels under ``~/.cache/opgate/toolchains/cuda-<ver>``
   (``$OPGATE_TOOLCHAINS`` moves it).

Each candidate is asked for its release (``nvcc --version``) and its real
toolkit root (``nvcc --dryrun`` prints ``_HERE_``; a wrapper script on PATH
would otherwise point ``CUDA_HOME`` at ``/usr/local``).

PyPI ships a complete nvcc driver only for CUDA 13 (``nvidia-cuda-nvcc`` plus its
split-out parts).  The CUDA 12 wheel ``nvidia-cuda-nvcc-cu12`` carries ``ptxas``,
``libnvvm`` and the crt headers but no ``nvcc``; :func:`ensure_nvcc` installs it,
finds no driver and raises :class:`ToolchainUnavailable` saying so (the verdict
is remembered, so the wheel is not fetched again for every cell).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from opgate.matrix.errors import OpgateError
from opgate.matrix.files import exclusive

_RELEASE_RE = re.compile(r"release (\d+)\.(\d+), V(\d+\.\d+\.\d+)")
_VERSION_RE = re.compile(r"^\d+\.\d+$")
#: Seconds one wheel install may take before opgate gives up on it.
INSTALL_TIMEOUT_S = 600


class ToolchainUnavailable(OpgateError):
    """No nvcc of the requested CUDA version can be had on this machine (a ``skip`` reason)."""


@dataclass(frozen=True)
class Toolchain:
    """One usable nvcc: what it is, where its toolkit root is, where it came from."""

    version: str  # "13.0": the CUDA axis value
    release: str  # "13.0.88": what nvcc --version reports
    nvcc: Path
    cuda_home: Path
    source: str  # "PATH", "env OPGATE_NVCC_13_0", "pypi nvidia-cuda-nvcc==13.2.*", ...

    @property
    def major(self) -> int:
        return int(self.version.split(".")[0])

    def to_json(self) -> dict[str, str]:
        return {
            "version": self.version,
            "release": self.release,
            "nvcc": str(self.nvcc),
            "cuda_home": str(self.cuda_home),
            "source": self.source,
        }


def toolchains_root() -> Path:
    """Where PyPI-installed toolkits go: ``$OPGATE_TOOLCHAINS``, else the user cache's ``toolchains``."""
    from opgate.validators.cache import user_cache_dir

    env = os.environ.get("OPGATE_TOOLCHAINS")
    return Path(env) if env else user_cache_dir() / "toolchains"


def _check_version(version: str) -> str:
    if not _VERSION_RE.match(version):
        raise ValueError(f"CUDA version must look like '13.0', got {version!r}")
    return version


def nvcc_release(nvcc: Path) -> str | None:
    """``"13.0.88"`` from ``nvcc --version``, or None when it does not run."""
    try:
        out = subprocess.run(
            [str(nvcc), "--version"], capture_output=True, text=True, timeout=60, check=False
        )
    except OSError:
        return None
    m = _RELEASE_RE.search(out.stdout)
    return m.group(3) if m else None


def nvcc_cuda_home(nvcc: Path) -> Path:
    """The toolkit root nvcc really uses (``_HERE_/..`` from ``--dryrun``), resolving wrapper scripts."""
    out = subprocess.run(
        [str(nvcc), "--dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    for line in (out.stdout + out.stderr).splitlines():
        if line.startswith("#$ _HERE_="):
            return Path(line.split("=", 1)[1].strip()).resolve().parent
    return nvcc.resolve().parent.parent


def _candidates(version: str) -> Iterator[tuple[Path, str]]:
    env_name = "OPGATE_NVCC_" + version.replace(".", "_")
    if os.environ.get(env_name):
        yield Path(os.environ[env_name]), f"env {env_name}"
    on_path = shutil.which("nvcc")
    if on_path:
        yield Path(on_path), "PATH"
    yield Path(f"/usr/local/cuda-{version}/bin/nvcc"), f"/usr/local/cuda-{version}"
    yield Path("/usr/local/cuda/bin/nvcc"), "/usr/local/cuda"
    marker = toolchains_root() / f"cuda-{version}" / "toolchain.json"
    if marker.is_file():
        data = json.loads(marker.read_text())
        if data.get("nvcc"):
            _finish_layout(Path(data["nvcc"]).parent.parent)
            yield Path(data["nvcc"]), str(data.get("source", "cache"))


def find_toolchain(version: str) -> Toolchain | None:
    """The first nvcc whose release is ``version`` (major.minor), without installing anything."""
    _check_version(version)
    seen: set[Path] = set()
    for nvcc, source in _candidates(version):
        if not nvcc.is_file() or nvcc.resolve() in seen:
            continue
        seen.add(nvcc.resolve())
        release = nvcc_release(nvcc)
        if release and ".".join(release.split(".")[:2]) == version:
            return Toolchain(version, release, nvcc, nvcc_cuda_home(nvcc), source)
    return None


def find_nvcc(version: str) -> Path | None:
    """Path of an nvcc of CUDA ``version`` already on this machine (or in opgate's cache)."""
    tc = find_toolchain(version)
    return tc.nvcc if tc else None


def _wheels_for(version: str) -> list[str]:
    """PyPI requirements that make up an nvcc toolkit of ``version``, every part pinned to it."""
    major = version.split(".", maxsplit=1)[0]
    if major == "12":
        return [f"nvidia-cuda-nvcc-cu12=={version}.*", f"nvidia-cuda-runtime-cu12=={version}.*"]
    return [
        f"nvidia-cuda-nvcc=={version}.*",
        f"nvidia-cuda-crt=={version}.*",
        f"nvidia-cuda-runtime=={version}.*",
        f"nvidia-nvvm=={version}.*",
        f"nvidia-cuda-cccl=={version}.*",
    ]


def _installer() -> list[str]:
    if importlib.util.find_spec("pip") is not None:
        return [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-deps", "-q"]
    uv = shutil.which("uv")
    if uv:
        return [uv, "pip", "install", "--python", sys.executable, "--no-deps", "-q"]
    raise ToolchainUnavailable(f"neither pip nor uv is available to {sys.executable} to install a toolkit")


def _finish_layout(home: Path) -> None:
    """Make a wheel-installed toolkit look like an installed one to cpp_extension.

    It links ``-L$CUDA_HOME/lib64 -lcudart``; the wheels ship ``lib/`` and only
    the versioned ``libcudart.so.13``.  Idempotent.
    """
    lib = home / "lib"
    if not lib.is_dir():
        return
    if not (home / "lib64").exists():
        (home / "lib64").symlink_to("lib")
    for versioned in lib.glob("lib*.so.*"):
        plain = lib / (versioned.name.split(".so.")[0] + ".so")
        if not plain.exists():
            plain.symlink_to(versioned.name)


def _install(version: str, dest: Path) -> dict[str, str]:
    """pip-install the wheels into ``dest`` and describe what came out (nvcc or the reason it did not)."""
    wheels = _wheels_for(version)
    tmp = Path(tempfile.mkdtemp(prefix=f".cuda-{version}-", dir=dest.parent))
    cmd = [*_installer(), "--target", str(tmp / "site"), *wheels]
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False)
    info = {"wheels": " ".join(wheels), "install_s": f"{time.monotonic() - start:.1f}"}
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        info["error"] = f"pip install {' '.join(wheels)} failed: {' | '.join(tail)}"
        return info
    if dest.exists():
        shutil.rmtree(dest)
    tmp.rename(dest)
    nvccs = sorted((dest / "site" / "nvidia").glob("*/bin/nvcc"))
    if not nvccs:
        bins = sorted(p.name for p in (dest / "site" / "nvidia").glob("*/bin/*"))
        info["error"] = (
            f"{' '.join(wheels)} installed into {dest} but ship no nvcc driver "
            f"(bin/ holds only: {', '.join(bins) or 'nothing'}); "
            f"set OPGATE_NVCC_{version.replace('.', '_')} to a CUDA {version} toolkit's nvcc"
        )
        shutil.rmtree(dest / "site", ignore_errors=True)  # keep only the verdict
        return info
    _finish_layout(nvccs[0].parent.parent)
    info["nvcc"] = str(nvccs[0])
    info["source"] = f"pypi {' '.join(wheels)}"
    return info


def ensure_nvcc(version: str) -> Toolchain:
    """A :class:`Toolchain` for CUDA ``version``, installing it from PyPI into the cache if needed.

    Raises :class:`ToolchainUnavailable` with the reason (also remembered in the
    cache, so a failed install is not retried by every cell; delete the
    ``cuda-<ver>`` folder to retry).
    """
    _check_version(version)
    found = find_toolchain(version)
    if found:
        return found
    root = toolchains_root()
    dest = root / f"cuda-{version}"
    marker = dest / "toolchain.json"
    with exclusive(root / f"cuda-{version}.lock"):
        if marker.is_file():
            info = json.loads(marker.read_text())
        else:
            info = _install(version, dest)
            if dest.is_dir():
                marker.write_text(json.dumps(info, indent=1) + "\n")
    if "error" in info:
        raise ToolchainUnavailable(f"no nvcc {version}: {info['error']}")
    found = find_toolchain(version)
    if found is None:
        raise ToolchainUnavailable(f"nvcc installed at {info.get('nvcc')} does not report release {version}")
    return found


def cuobjdump_path() -> Path:
    """cuobjdump: Triton's bundled copy, else one next to an nvcc, else on PATH."""
    spec = importlib.util.find_spec("triton")
    candidates: list[Path] = []
    if spec and spec.origin:
        candidates.append(Path(spec.origin).parent / "backends" / "nvidia" / "bin" / "cuobjdump")
    on_path = shutil.which("cuobjdump")
    if on_path:
        candidates.append(Path(on_path))
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(Path(nvcc).resolve().parent / "cuobjdump")
    candidates.append(Path("/usr/local/cuda/bin/cuobjdump"))
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    raise ToolchainUnavailable(
        "no cuobjdump: install triton (its wheel ships one) or a CUDA toolkit; looked in "
        + ", ".join(str(c) for c in candidates)
    )


def provide_nvcc(version: str) -> Path:
    """The nvcc a ``build`` cell of CUDA ``version`` uses, installed from PyPI when absent.

    The runner asks this once per version before scheduling build cells, so a
    fresh CI machine checks two nvcc versions without manual setup.  Set
    ``OPGATE_NO_TOOLCHAIN_INSTALL=1`` to only look (cells then skip with the reason).
    """
    if os.environ.get("OPGATE_NO_TOOLCHAIN_INSTALL") == "1":
        found = find_nvcc(version)
        if found is None:
            raise ToolchainUnavailable(f"nvcc {version} not found here (installs disabled)")
        return found
    return ensure_nvcc(version).nvcc
