"""Verdict cache: unchanged cells are served, a changed op re-runs, ``--no-cache`` re-runs all."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from opgate.matrix.cell import Cell
from opgate.validators.cache import VerdictCache, environment_identity
from opgate.validators.options import RunOptions
from opgate.validators.result import CellResult, RunResults, Verdict
from opgate.validators.runner import Runner

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "fixtures_runner"


def Spec(path: Path) -> Any:
    """The real spec (its references decide which files the cache key covers)."""
    from opgate.matrix.spec import load_spec

    return load_spec(path, path.parent.parent)


def make_ops(tmp: Path) -> Path:
    ops = tmp / "ops"
    shutil.copytree(FIXTURES, ops, ignore=shutil.ignore_patterns("__pycache__"))
    return ops


def test_key_follows_op_sources_overrides_and_environment(tmp_path: Path) -> None:
    ops = make_ops(tmp_path)
    spec = Spec(ops / "fx_segv" / "spec.yaml")
    env = environment_identity([], {})
    cell = Cell("fx_segv", "native", "2.13.0", "none", "cpu", "fp32", "contiguous", "eager")
    cache = VerdictCache(tmp_path / "cache", env)
    key = cache.key(cell, spec)
    assert VerdictCache(tmp_path / "cache", env).key(cell, spec) == key  # stable
    overridden = Cell(**cell.axes(), overrides=(("tolerance", {"k": 3.0}),))
    assert cache.key(overridden, spec) != key
    gpu_env = environment_identity([{"name": "NVIDIA H200", "capability": "9.0"}], {})
    assert VerdictCache(tmp_path / "cache", gpu_env).key(cell, spec) != key
    (ops / "fx_common.py").write_text((ops / "fx_common.py").read_text() + "\n# shared module edited\n")
    assert VerdictCache(tmp_path / "cache", env).key(cell, spec) != key
    other_op = Spec(ops / "fx_hang" / "spec.yaml")
    before = VerdictCache(tmp_path / "cache", env).key(cell, other_op)
    (ops / "fx_segv" / "impl.py").write_text((ops / "fx_segv" / "impl.py").read_text() + "\n# edited\n")
    assert VerdictCache(tmp_path / "cache", env).key(cell, other_op) == before  # another op's edit


def test_only_settled_verdicts_are_stored(tmp_path: Path) -> None:
    spec = Spec(make_ops(tmp_path) / "fx_segv" / "spec.yaml")
    cache = VerdictCache(tmp_path / "cache", environment_identity([], {}))
    for i, verdict in enumerate(Verdict):
        cell = Cell("fx_segv", "native", "2.13.0", "none", "cpu", "fp32", "contiguous", "eager", f"s{i}")
        cache.put(CellResult(cell, verdict, {"env_key": "k"}, seed=i), spec)
        hit = cache.get(cell, spec)
        settled = (Verdict.PASS, Verdict.FAIL, Verdict.FALLBACK, Verdict.UNSUPPORTED, Verdict.ENVIRONMENT)
        assert (hit is not None) == (verdict in settled), verdict
        if hit is not None:
            assert (hit.id, hit.seed) == (cell.id, i)


def test_a_failed_control_is_stored_only_beside_the_cell_it_explains(tmp_path: Path) -> None:
    spec = Spec(make_ops(tmp_path) / "fx_segv" / "spec.yaml")
    cache = VerdictCache(tmp_path / "cache", environment_identity([], {}))
    control = Cell("fx_segv", "control", "2.13.0", "none", "cpu", "fp32", "contiguous", "aoti")
    crashed = CellResult(control, Verdict.ERROR, {"env_key": "k"}, reason="worker killed by SIGSEGV")
    cache.put(crashed, spec)  # a crash alone is not settled: the next run tries again
    assert cache.get(control, spec) is None
    cache.put(crashed, spec, explains=True)
    hit = cache.get(control, spec)
    assert hit is not None
    assert hit.reason == "worker killed by SIGSEGV"
    op_cell = Cell("fx_segv", "native", "2.13.0", "none", "cpu", "fp32", "contiguous", "aoti")
    cache.put(CellResult(op_cell, Verdict.ERROR, {"env_key": "k"}), spec, explains=True)
    assert cache.get(op_cell, spec) is None  # only controls explain: an op's own error is never kept


def opgate_run(ops: Path, out: Path, cache: Path, *extra: str) -> dict[str, Any]:
    sel = ["--select", "fx_segv.native-*-cpu-fp32-*", "--select", "fx_flaky.native-*-cpu-fp32-*"]
    base = [sys.executable, "-m", "opgate.validators", "run", "--config", str(ops / "matrix.yaml")]
    proc = subprocess.run(
        [*base, "--ops-path", str(ops), *sel, "--out", str(out), "--no-progress", *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OPGATE_CACHE": str(cache)},
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record: dict[str, Any] = json.loads((out / "run.json").read_text())
    record["results"] = RunResults.read(out / "results.json")
    return record


@pytest.mark.slow
def test_rerun_serves_unchanged_ops_and_reruns_the_changed_one(tmp_path: Path) -> None:
    ops, cache = make_ops(tmp_path), tmp_path / "cache"
    first = opgate_run(ops, tmp_path / "1", cache)
    ids = sorted(c.id for c in first["results"].cells)
    assert len(ids) == 2
    assert first["cached_cells"] == []
    assert {c.verdict for c in first["results"].cells} == {Verdict.PASS}

    second = opgate_run(ops, tmp_path / "2", cache)
    assert sorted(second["cached_cells"]) == ids
    assert second["workers"] == []  # nothing ran
    assert second["fork_server_preload_s"] == {}  # and nothing was started: no torch import at all
    assert not list((tmp_path / "2" / "logs" / "workers").glob("forkserver-*.log"))
    assert [c.to_json() for c in second["results"].cells] == [c.to_json() for c in first["results"].cells]
    for cell_id in ids:  # a served cell keeps the log of the run that produced its verdict
        log = (tmp_path / "2" / "logs" / f"{cell_id}.log").read_text()
        assert log.startswith("=== served from the verdict cache")
        assert f"=== {cell_id} attempt 1 seed" in log

    impl = ops / "fx_flaky" / "impl.py"
    impl.write_text(impl.read_text() + "\n# a change to this op only\n")
    third = opgate_run(ops, tmp_path / "3", cache)
    flaky_id = next(i for i in ids if i.startswith("fx_flaky"))
    assert third["cached_cells"] == [i for i in ids if i != flaky_id]
    assert [c for w in third["workers"] for c in w["cells"]] == [flaky_id]
    assert third["timings"]["served_s"] >= third["timings"]["plan_s"]  # served while the lane ran

    segv_id = next(i for i in ids if i.startswith("fx_segv"))
    (record,) = [p for p in cache.rglob("*.json") if json.loads(p.read_text()).get("id") == segv_id]
    record.write_text("{not json")  # a stored record that no longer loads, served in the background
    impl.write_text(impl.read_text() + "\n# another change to this op\n")
    fourth = opgate_run(ops, tmp_path / "3b", cache)
    assert fourth["cached_cells"] == []
    assert sorted(c for w in fourth["workers"] for c in w["cells"]) == ids  # it ran after all
    assert {c.id: c.verdict for c in fourth["results"].cells} == dict.fromkeys(ids, Verdict.PASS)

    forced = opgate_run(ops, tmp_path / "4", cache, "--no-cache")
    assert forced["cached_cells"] == []
    assert sorted(c for w in forced["workers"] for c in w["cells"]) == ids


def test_explicit_seed_bypasses_the_cache(tmp_path: Path) -> None:
    class Consulted(VerdictCache):
        def __init__(self) -> None:
            self.asked = 0

        def get(self, cell: Cell, spec: Any, log: Path | None = None) -> CellResult | None:
            self.asked += 1
            return None

    cell = Cell("fx_segv", "native", "2.13.0", "none", "cpu", "fp32", "contiguous", "eager")
    for seed, asked in ((1234, 0), (None, 1)):
        runner = Runner(RunOptions(out=tmp_path, seed=seed))
        runner._cache = cache = Consulted()
        runner._specs = {"fx_segv": Spec(make_ops(tmp_path / str(seed)) / "fx_segv" / "spec.yaml")}
        assert not runner._serve_cached(cell)
        assert cache.asked == asked


def test_op_digest_follows_the_imports_of_the_specs_references() -> None:
    """Shared helpers and imported sibling ops count; unrelated ops and unimported scripts do not."""
    from opgate.matrix.sources import op_source_files
    from opgate.matrix.spec import load_specs

    specs = load_specs()
    rel = {op: {str(f.relative_to(ROOT)) for f in op_source_files(specs[op])} for op in specs}
    fused = rel["fused_add_rms_norm"]
    assert "ops/fused_add_rms_norm/spec.yaml" in fused
    assert "ops/rms_norm/triton_kernels.py" in fused  # imported sibling kernels
    assert "ops/_triton_util.py" in fused  # shared launch helpers
    assert not any(f.startswith("ops/silu_mul/") for f in fused)
    assert "ops/rms_norm/cuda/selftest.py" not in rel["rms_norm"]  # a script nothing imports
    assert "ops/_cuda/common.cuh" in rel["rms_norm"]  # the CUDA implementation's shared header
    assert "ops/rms_norm/cuda/rms_norm_kernels.cu" in rel["rms_norm"]
    assert not any(f.startswith("ops/rms_norm/") for f in rel["rope"])
    # the launch-replay library the Triton ops build at import (spec ``libraries``): a change to
    # its C++ changes what their cells run; the ops that declare none do not depend on it
    assert "ops/_replay/replay.cpp" in rel["rope"]
    assert "ops/_replay/replay.cpp" not in rel["sdpa"]
