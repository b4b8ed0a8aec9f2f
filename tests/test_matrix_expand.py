"""Expansion: counts, stable ids, the axis rules, selection and overrides."""

from __future__ import annotations

import builtins
import dataclasses
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from opgate import matrix
from opgate.matrix.cell import Cell
from opgate.matrix.config import MatrixConfig, load_config
from opgate.matrix.errors import ConfigError, SelectionEmpty
from opgate.matrix.expand import expand
from opgate.matrix.spec import OpSpec, load_spec

DATA = Path(__file__).parent / "data" / "config"
OPS = DATA / "ops"
TORCH = "2.13.0+cpu"


@pytest.fixture(scope="module")
def specs() -> dict[str, OpSpec]:
    return {"toy": load_spec(OPS / "toy" / "spec.yaml", OPS)}


@pytest.fixture(scope="module")
def small() -> MatrixConfig:
    return load_config(DATA / "small.yaml")


def ids(cells: list[Cell]) -> list[str]:
    return [c.id for c in cells]


def test_counts_follow_the_claims(small: MatrixConfig, specs: dict[str, OpSpec]) -> None:
    cells = expand(small, specs, TORCH)
    # tri: cpu 2 dtypes x 2 layouts x (eager, compile) + sm_90 x (eager, compile, cudagraphs) + 1 build
    # cu (fp32; eager, build): cpu 2 layouts + sm_90 2 layouts + 1 build
    # ext (external: no build): cpu 2x2x2 + sm_90 2x2x3
    assert Counter(c.impl for c in cells) == {"tri": 8 + 12 + 1, "cu": 2 + 2 + 1, "ext": 8 + 12}
    assert len(cells) == 46
    assert len(set(ids(cells))) == 46


GOLDEN = [
    "toy.cu-pt2.13-cu13.0-sm_90-all-all-build",
    "toy.cu-pt2.13-cu13.0-sm_90-fp32-contiguous-eager",
    "toy.ext-pt2.13-cu13.0-sm_90-fp16-transposed-cudagraphs",
    "toy.tri-pt2.13-cpu-fp16-transposed-compile",
    "toy.tri-pt2.13-cu13.0-sm_90-all-all-build",
]


def test_golden_ids_are_stable(small: MatrixConfig, specs: dict[str, OpSpec]) -> None:
    got = ids(expand(small, specs, TORCH))
    assert [i for i in got if i in GOLDEN] == GOLDEN
    assert got[0] == "toy.cu-pt2.13-cpu-fp32-contiguous-eager"


def test_issue_example_id_from_the_repository_matrix() -> None:
    cells = matrix.load_cells(select=["rms_norm.*"], torch_version="2.13.0")
    assert "rms_norm.triton-pt2.13-cpu-bf16-transposed-compile" in ids(cells)
    assert all(c.id.startswith("rms_norm.") for c in cells)


def test_sorted_deterministic_and_pure(
    small: MatrixConfig, specs: dict[str, OpSpec], monkeypatch: pytest.MonkeyPatch
) -> None:
    first = expand(small, specs, TORCH)
    assert ids(first) == sorted(ids(first))

    def no_io(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("expand must not read files or the environment")

    monkeypatch.setattr(builtins, "open", no_io)
    monkeypatch.setattr(Path, "read_text", no_io)
    monkeypatch.setattr("importlib.metadata.version", no_io)
    again = expand(small, dict(reversed(list(specs.items()))), TORCH)
    assert ids(again) == ids(first)
    assert [c.overrides for c in again] == [c.overrides for c in first]


def test_arch_cuda_rules(small: MatrixConfig, specs: dict[str, OpSpec]) -> None:
    two_cudas = dataclasses.replace(small, cuda=("12.9", "13.0"))
    cells = expand(two_cudas, specs, TORCH)
    assert {c.cuda for c in cells if c.arch == "cpu"} == {"none"}
    gpu = [c for c in cells if c.is_gpu]
    assert Counter(c.cuda for c in gpu) == {"12.9": 28, "13.0": 28}
    assert len(cells) == 18 + 2 * 28


def test_build_cuda_versions_reach_build_cells_only(small: MatrixConfig, specs: dict[str, OpSpec]) -> None:
    """``build_cuda`` adds nvcc versions to the binary evidence without a runtime column."""
    cfg = dataclasses.replace(small, build_cuda=("13.2",))
    cells = expand(cfg, specs, TORCH)
    assert sorted(c.id for c in cells if c.cuda == "13.2") == [
        "toy.cu-pt2.13-cu13.2-sm_90-all-all-build",
        "toy.tri-pt2.13-cu13.2-sm_90-all-all-build",
    ]
    assert len(cells) == len(expand(small, specs, TORCH)) + 2
    same = dataclasses.replace(small, build_cuda=("13.0",))
    assert ids(expand(same, specs, TORCH)) == ids(expand(small, specs, TORCH))


def test_gpu_only_modes_and_build_cells(small: MatrixConfig, specs: dict[str, OpSpec]) -> None:
    cells = expand(dataclasses.replace(small, arch=("cpu", "sm_80", "sm_90")), specs, TORCH)
    assert all(c.is_gpu for c in cells if c.mode in ("cudagraphs", "build"))
    build = [c for c in cells if c.mode == "build"]
    assert sorted((c.impl, c.arch) for c in build) == [
        ("cu", "sm_80"),
        ("cu", "sm_90"),
        ("tri", "sm_80"),
        ("tri", "sm_90"),
    ]
    assert {(c.dtype, c.layout, c.shapes) for c in build} == {("all", "all", "default")}


def test_implementation_lists_narrow_the_op(small: MatrixConfig, specs: dict[str, OpSpec]) -> None:
    cells = expand(small, specs, TORCH)
    cu = [c for c in cells if c.impl == "cu" and c.mode != "build"]
    assert {c.dtype for c in cu} == {"fp32"}
    assert {c.mode for c in cu} == {"eager"}
    assert {c.dtype for c in cells if c.mode != "build"} == {"fp32", "fp16"}  # bf16: not claimed
    assert "strided" not in {c.layout for c in cells}


def test_torch_installed_and_columns(small: MatrixConfig, specs: dict[str, OpSpec]) -> None:
    assert {c.torch for c in expand(small, specs, "none")} == {"none"}
    assert ids(expand(small, specs, "none"))[0] == "toy.cu-ptnone-cpu-fp32-contiguous-eager"
    same_column = dataclasses.replace(small, torch=("installed", "2.11.0"))
    assert {c.torch for c in expand(same_column, specs, "2.11.0+cu130")} == {"2.11.0+cu130"}
    two = expand(same_column, specs, TORCH)
    assert Counter(c.torch for c in two) == {TORCH: 46, "2.11.0": 46}


def test_shape_sets(small: MatrixConfig, specs: dict[str, OpSpec]) -> None:
    cells = expand(dataclasses.replace(small, shapes=("default", "big")), specs, TORCH)
    big = [c for c in cells if c.shapes == "big"]
    assert len(big) == 46 - 2  # every cell again except the two build cells
    assert all(c.id.endswith("-big") for c in big)


def test_config_select_and_skip(small: MatrixConfig, specs: dict[str, OpSpec]) -> None:
    config = dataclasses.replace(small, select=("toy.tri-*",), skip=("*-compile", "*-build"))
    cells = expand(config, specs, TORCH)
    assert {c.impl for c in cells} == {"tri"}
    assert Counter(c.mode for c in cells) == {"eager": 8, "cudagraphs": 4}


def test_selection_empty(small: MatrixConfig, specs: dict[str, OpSpec]) -> None:
    with pytest.raises(SelectionEmpty) as info:
        expand(dataclasses.replace(small, select=("toy.tri-*-fp64-*",)), specs, TORCH)
    assert info.value.exit_code == 4
    assert "none of the 46 cells" in str(info.value)


def test_cli_selection_goes_after_config(small: MatrixConfig) -> None:
    cells = matrix.load_cells(
        DATA / "small.yaml", [OPS], select=["toy.ext-*"], skip=["*-sm_90-*"], torch_version=TORCH
    )
    assert len(cells) == 8
    with pytest.raises(SelectionEmpty, match="--select nothing-"):
        matrix.load_cells(DATA / "small.yaml", [OPS], select=["nothing-*"], torch_version=TORCH)


def test_overrides_later_wins_per_key(small: MatrixConfig, specs: dict[str, OpSpec]) -> None:
    by_id = {c.id: c for c in expand(small, specs, TORCH)}
    both = by_id["toy.tri-pt2.13-cpu-fp16-contiguous-compile"]
    assert both.override("tolerance") == {"k": 3.0, "atol_floor": 0.001}
    assert both.override("timeout_s") == 120.0
    first_only = by_id["toy.ext-pt2.13-cpu-fp16-contiguous-compile"]
    assert first_only.override("tolerance") == {"k": 3.0}
    assert first_only.override("timeout_s") == 60.0
    assert by_id["toy.tri-pt2.13-cpu-fp32-contiguous-compile"].overrides == ()
    assert Cell.from_json(both.to_json()).overrides == both.overrides


def test_override_matching_no_cell_is_an_error(small: MatrixConfig, specs: dict[str, OpSpec]) -> None:
    bad = dataclasses.replace(small.overrides[0], select="toy.*-fp64-*")
    with pytest.raises(ConfigError) as info:
        expand(dataclasses.replace(small, overrides=(bad,)), specs, TORCH)
    assert "matches no cell" in str(info.value)
    assert f"{DATA / 'small.yaml'}:{bad.where.line}" in str(info.value)


def test_unsupported_cells_are_generated(small: MatrixConfig, specs: dict[str, OpSpec]) -> None:
    cells = ids(expand(small, specs, TORCH))
    impl = specs["toy"].implementations["tri"]
    declared = [i for i in cells if impl.unsupported_reason(i)]
    assert declared == [
        "toy.tri-pt2.13-cpu-fp16-transposed-compile",
        "toy.tri-pt2.13-cpu-fp16-transposed-eager",
        "toy.tri-pt2.13-cu13.0-sm_90-fp16-transposed-compile",
        "toy.tri-pt2.13-cu13.0-sm_90-fp16-transposed-cudagraphs",
        "toy.tri-pt2.13-cu13.0-sm_90-fp16-transposed-eager",
    ]


def test_implementation_glob_matching_nothing(small: MatrixConfig, specs: dict[str, OpSpec]) -> None:
    with pytest.raises(ConfigError) as info:
        expand(dataclasses.replace(small, implementations=("trition",)), specs, TORCH)
    assert "'trition' matches nothing" in str(info.value)
    assert "did you mean 'tri'?" in str(info.value)
