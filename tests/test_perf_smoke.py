"""The GPU commands' full code paths, driven on CPU: study, bench and block end to end.

Nothing here measures anything: CUDA events are replaced by host-clock
stand-ins, the device properties and ceilings by fixed values, and every
timing budget is cut to a few repetitions.  What it proves is the plumbing
a CPU-only CI machine cannot otherwise reach: specs resolved, inputs made, kernels
launched (Triton's interpreter), samples attributed, verdicts computed,
JSON and Markdown written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from opgate.matrix.spec import load_specs

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent

_SCRIPT = r"""
import json, sys, time, types
from pathlib import Path
import torch

class HostEvent:
    def __init__(self, enable_timing=False):
        self.t = 0.0
    def record(self):
        self.t = time.perf_counter()
    def elapsed_time(self, end):
        return (end.t - self.t) * 1000.0

torch.cuda.Event = HostEvent
torch.cuda.synchronize = lambda device=None: None
props = types.SimpleNamespace(name="Fake GPU", major=9, minor=0, multi_processor_count=4,
                              L2_cache_size=1 << 20, uuid="fake-uuid")
torch.cuda.get_device_properties = lambda *a, **k: props

from opgate.matrix.spec import load_specs
from opgate.validators.perf import bench, block_run, ceilings, study, timing
from opgate.validators.perf.block import BlockConfig

timing.L2_FLUSH_BYTES = 4096
fast = timing.TimingConfig(warmup_ms=0.2, rep_ms=2.0, min_reps=6, max_reps=6)
timing.CHECK_TIMING = study.SLOWDOWN_TIMING = bench.BENCH_TIMING = block_run.BLOCK_TIMING = fast
ceilings.get = lambda *a, **k: ceilings.Ceilings("Fake GPU", "fake", 1000.0, 100.0, 1, 1, 1.0, 1.0)
out = Path(sys.argv[1])
s = study.run_study(study.StudyConfig(shapes=((16, 256),), runs=3, history_runs=1, device="cpu"), out)
cases = bench.plan(load_specs(), ["rms_norm"], shapes=[(16, 256)], dtypes=["fp32"])
b = bench.run_bench(cases, out, device="cpu", peers=["aten"])
# the same cases between a producer and a consumer (what a "worth it in context" verdict times)
ctx = bench.Context("scaled-then-summed", producer=lambda x, w, eps=1e-6: ((x * 2.0, w, eps), {}),
                    consumer=lambda y: y.float().sum())
c = bench.run_bench(cases[:1], out / "ctx", device="cpu", peers=["aten"], context=ctx)
k = block_run.run_block(BlockConfig(hidden=64, heads=4, seq=16, batch=2, ffn=96), out, device="cpu",
                        modes=("eager",))
print(json.dumps({"study": s, "bench": b, "context": c, "block": k}))
"""


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    out = tmp_path_factory.mktemp("perf")
    env = {
        **os.environ,
        "TRITON_INTERPRET": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, (os.environ.get("PYTHONPATH"), str(ROOT)))),
        "PATH": "/usr/bin:/bin",
    }
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(out)],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), out


def test_study_path_writes_its_record(smoke: tuple[dict[str, Any], Path]) -> None:
    data, out = smoke
    study = data["study"]
    shape = study["shapes"][0]
    assert [s["kind"] for s in shape["sessions"]] == [
        "history",
        "aa",
        "planted",
        "aa",
        "planted",
        "aa",
        "planted",
    ]
    assert all(len(s["samples_us"]) == 6 and len(s["baseline_us"]) == 6 for s in shape["sessions"])
    assert shape["summary"]["aa_runs"] == shape["summary"]["planted_runs"] == 3
    assert shape["planted_extra_elements"] == 845  # 10% of rms_norm's 16896 bytes, in bf16 elements
    assert isinstance(shape["measured_slowdown"], float)
    assert study["info"]["device"] == "Fake GPU"
    md = (out / "study.md").read_text()
    assert "| 16x256 |" in md
    assert "planted caught" in md
    assert json.loads((out / "study.json").read_text())["config"]["runs"] == 3


def test_bench_path_times_peers_and_records_the_unavailable(smoke: tuple[dict[str, Any], Path]) -> None:
    data, out = smoke
    bench = data["bench"]
    assert [(c["direction"], c["dtype"]) for c in bench["cases"]] == [
        ("forward", "fp32"),
        ("backward", "fp32"),
    ]
    assert bench["format"] == "opgate.bench/1"
    for case in bench["cases"]:
        assert {"opgate-triton", "opgate-triton-compiled", "aten"} <= set(case["results"]), case["errors"]
        roles = {n: r["role"] for n, r in case["results"].items()}
        assert roles == {"opgate-triton": "opgate", "opgate-triton-compiled": "variant", "aten": "peer"}
        assert case["results"]["aten"]["n"] == 6
    forward = bench["cases"][0]
    assert forward["bytes"] == 2 * 16 * 256 * 4 + 256 * 4
    mine = forward["results"]["opgate-triton"]
    assert mine["gbps"] == pytest.approx(forward["bytes"] / mine["median_us"] / 1e3, abs=0.06)
    impls = {
        f"opgate-{n}" for n, i in load_specs()["rms_norm"].implementations.items() if i.kind != "external"
    }
    for name in impls:  # each first-party impl is timed or says why not (a CUDA extension, on a CPU torch)
        assert name in forward["results"] or name in bench["unavailable"]["rms_norm"]
    from opgate.validators.perf.peers import liger_peer

    if liger_peer("rms_norm") is None:  # not installed: the table says why it is missing
        assert "liger" in bench["unavailable"]["rms_norm"]
    else:  # installed, but this run asked for aten alone
        assert "liger" not in forward["results"]
        assert "liger" not in bench["unavailable"]["rms_norm"]
    from opgate.reports import bench_table

    md = bench_table.render(bench_table.load([out / "bench.json"]))  # the one renderer reads it back
    assert "### rms_norm" in md
    assert "| 16x256 | fp32 | fwd |" in md
    assert "Fake GPU (sm_90)" in md


def test_bench_in_a_context_times_every_peer_between_producer_and_consumer(
    smoke: tuple[dict[str, Any], Path],
) -> None:
    data, _ = smoke
    (case,) = data["context"]["cases"]
    assert case["context"] == "scaled-then-summed"
    assert {"opgate-triton", "aten"} <= set(case["results"]), case["errors"]
    assert all(r["gbps"] is None for r in case["results"].values()), "times include the neighbours"


def test_block_path_reports_parity_times_and_flags(smoke: tuple[dict[str, Any], Path]) -> None:
    data, out = smoke
    block = data["block"]
    assert set(block["parity_relerr"]) == {"opgate/eager", "torch/eager"}
    assert block["parity_relerr"]["opgate/eager"] < 2e-2
    assert set(block["blocks"]["forward"]) == set(block["blocks"]["step"]) == {"opgate/eager", "torch/eager"}
    assert set(block["alone"]) == {"rms_norm", "fused_add_rms_norm", "silu_mul", "rope"}
    assert all(set(t) == {"opgate", "torch"} for t in block["alone"].values())
    assert isinstance(block["flags"], list)
    assert "relerr vs fp32" in (out / "block.md").read_text()
