"""A CUDA C++ op builds what its spec declares: sources and arch policy come from spec.yaml only.

``BUILT = load_for_spec(__name__)`` in ``ops/<op>/cuda_impl.py`` finds the
implementation whose ``module`` is that module and builds its ``sources`` for
its ``arch_policy`` under the same library name the build check uses, so the
runtime binary and the inspected one cannot disagree.  Exercised on CPU with
the build itself recorded instead of run (a CPU torch cannot build it; the GPU
run builds it for real).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from opgate.matrix.spec import load_specs
from opgate.matrix.spec_schema import OPS_DIR
from opgate.validators import cuda_build as _cuda_build


def _fake_module(monkeypatch: pytest.MonkeyPatch, name: str, file: Path) -> None:
    module = types.ModuleType(name)
    module.__file__ = str(file)
    monkeypatch.setitem(sys.modules, name, module)


def _recorded(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    calls: list[tuple[Any, ...]] = []

    def load_library(*args: Any) -> str:
        calls.append(args)
        return "built"

    monkeypatch.setattr(_cuda_build, "load_library", load_library)
    return calls


@pytest.mark.parametrize("op", ["rms_norm", "silu_mul"])
def test_opgate_cuda_ops_build_their_specs_sources_and_arches(
    monkeypatch: pytest.MonkeyPatch, op: str
) -> None:
    calls = _recorded(monkeypatch)
    module = f"opgate.ops.{op}.cuda_impl"
    _fake_module(monkeypatch, module, OPS_DIR / op / "cuda_impl.py")
    built: object = _cuda_build.load_for_spec(module)  # the recorded stand-in, not a BuiltExtension
    assert built == "built"
    impl = load_specs()[op].implementations["cuda"]
    assert calls == [
        (f"opgate_{op}_cuda", impl.sources, impl.arch_policy["sass"], bool(impl.arch_policy.get("ptx")))
    ]
    assert _cuda_build.library_name(op, "cuda") == calls[0][0], "the build check's name"
    assert "ARCHES" not in (OPS_DIR / op / "cuda_impl.py").read_text(), "no second arch list"


def test_changing_the_spec_changes_the_build(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    folder = tmp_path / "rms_norm"
    shutil.copytree(OPS_DIR / "rms_norm", folder)
    shutil.copytree(OPS_DIR / "_replay", tmp_path / "_replay")  # the library its triton impl declares
    spec = folder / "spec.yaml"
    text = spec.read_text()
    assert text.count("arch_policy: {sass: [sm_80, sm_90], ptx: false}") == 2
    spec.write_text(text.replace("arch_policy: {sass: [sm_80, sm_90], ptx: false}\n    modes:",
                                 "arch_policy: {sass: [sm_90], ptx: true}\n    modes:"))  # fmt: skip
    calls = _recorded(monkeypatch)
    _fake_module(monkeypatch, "opgate.ops.rms_norm.cuda_impl", folder / "cuda_impl.py")
    _cuda_build.load_for_spec("opgate.ops.rms_norm.cuda_impl")
    _, sources, sass, ptx = calls[0]
    assert (sass, ptx) == (["sm_90"], True)
    assert sources == [folder / "cuda/rms_norm_op.cpp", folder / "cuda/rms_norm_kernels.cu"]


def test_a_module_no_implementation_names_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    _recorded(monkeypatch)
    _fake_module(monkeypatch, "opgate.ops.rms_norm.other", OPS_DIR / "rms_norm" / "other.py")
    with pytest.raises(
        ValueError, match=r"expected one cuda implementation with module opgate\.ops\.rms_norm\.other"
    ):
        _cuda_build.load_for_spec("opgate.ops.rms_norm.other")


def test_the_payload_reaches_the_harness_build_through_its_own_module(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``ops/`` imports no stage: its ``load_for_spec`` is the builder ``opgate.validators`` installed."""
    from opgate.ops import _extension

    calls = _recorded(monkeypatch)
    _fake_module(monkeypatch, "opgate.ops.silu_mul.cuda_impl", OPS_DIR / "silu_mul" / "cuda_impl.py")
    assert _extension.load_for_spec("opgate.ops.silu_mul.cuda_impl") == "built"
    assert calls[0][0] == "opgate_silu_mul_cuda"


@pytest.mark.integration
def test_without_the_harness_a_cuda_op_says_how_it_is_built() -> None:
    """Imported outside opgate (no builder installed), the op refuses saying why, before any build."""
    code = (
        "import sys\n"
        "from opgate.ops import _extension\n"
        "assert 'opgate.validators' not in sys.modules\n"
        "try:\n"
        "    _extension.load_for_spec('opgate.ops.rms_norm.cuda_impl')\n"
        "except _extension.CudaBuildUnsupported as exc:\n"
        "    print('refused:', exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert "refused: no opgate builder is installed" in out.stdout


def test_a_build_cell_builds_the_library_its_module_asks_for_at_import(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The Triton ops' declared library has the key the launch replay loads: built once, found later."""
    from opgate.ops import _replay
    from opgate.validators.checks import build as build_check

    asked: list[tuple[Any, ...]] = []

    def recorded_build(name: str, sources: Any, sass: Any, ptx: bool, toolchain: Any, **kw: Any) -> Any:
        asked.append((name, [Path(s).resolve() for s in sources], list(sass), ptx, kw))
        return _cuda_build.BuiltExtension(name, Path("/lib.so"), Path("/d"), {}, False, 1.5, Path("/log"))

    monkeypatch.setattr(_cuda_build, "build", recorded_build)
    monkeypatch.setattr(_cuda_build, "default_toolchain", lambda **_: "toolchain")
    rope = load_specs([OPS_DIR])["rope"].implementations["triton"]
    monkeypatch.delenv("OPGATE_BUILD_LIBRARIES", raising=False)  # a run without GPUs: nobody loads it
    assert build_check._libraries(rope) == [
        {"name": "opgate_replay", "state": "not built: no GPU in this run loads it"}
    ]
    assert not asked
    monkeypatch.setenv("OPGATE_BUILD_LIBRARIES", "1")  # what the runner sets where there are GPUs
    found = build_check._libraries(rope)
    assert found == [{"name": "opgate_replay", "state": "built in 1.5 s", "library": "/lib.so"}]
    name, sources, sass, ptx, kw = asked[0]
    assert (name, sources, sass, ptx) == (_replay.LIBRARY_NAME, [_replay.SOURCE], list(_replay.ARCHES), False)
    assert kw == {"wait": False}  # a build under way elsewhere is left to it


def test_a_library_being_built_elsewhere_is_left_to_it_and_a_failed_one_fails_the_cell(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from opgate.validators.checks import CellOutcome
    from opgate.validators.checks import build as build_check
    from opgate.validators.result import CheckResult, Verdict

    monkeypatch.setattr(_cuda_build, "default_toolchain", lambda **_: "toolchain")
    monkeypatch.setenv("OPGATE_BUILD_LIBRARIES", "1")
    rope = load_specs([OPS_DIR])["rope"].implementations["triton"]

    def busy(*_: Any, **__: Any) -> Any:
        raise _cuda_build.BuildBusy("held")

    monkeypatch.setattr(_cuda_build, "build", busy)
    assert build_check._libraries(rope) == [
        {"name": "opgate_replay", "state": "being built by another process"}
    ]

    def broken(*_: Any, **__: Any) -> Any:
        raise _cuda_build.CudaBuildError("replay.cpp:1: error: expected ';'")

    monkeypatch.setattr(_cuda_build, "build", broken)
    libraries = build_check._libraries(rope)
    passed = CellOutcome([CheckResult("build", Verdict.PASS, "3 kernel builds hold sm_90 SASS")])
    failed = build_check._with_libraries(passed, libraries)
    assert failed.checks[0].status is Verdict.FAIL
    assert failed.checks[0].summary.startswith("library opgate_replay failed to build")
    assert "expected ';'" in failed.checks[0].details["libraries"][0]["log"]


def test_without_a_cuda_torch_the_library_is_not_built_and_the_cell_stands(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """This machine's CPU torch: the declared library is reported unbuilt, nothing fails."""
    import torch

    from opgate.validators.checks import build as build_check

    monkeypatch.setenv("OPGATE_BUILD_LIBRARIES", "1")
    rope = load_specs([OPS_DIR])["rope"].implementations["triton"]
    if torch.version.cuda is not None:
        pytest.skip("a CUDA torch builds the library")
    (entry,) = build_check._libraries(rope)
    assert entry["name"] == "opgate_replay"
    assert entry["state"].startswith("not built: torch")
