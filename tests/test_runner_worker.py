"""The worker's per-cell wrapper, in-process: output capture, validator bugs, sticky device errors."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest

from opgate.matrix.cell import Cell
from opgate.validators import worker
from opgate.validators.checks import CellOutcome
from opgate.validators.result import CheckResult, Verdict

CELL = Cell("op", "impl", "2.13.0", "none", "cpu", "fp32", "contiguous", "eager")


class Spec:
    root = ""


def task(tmp: Path) -> dict[str, Any]:
    return {
        "cell": CELL.to_json(),
        "seed": 5,
        "attempt": 1,
        "log": str(tmp / "cell.log"),
        "workdir": str(tmp / "work"),
        "timeout_s": 10,
    }


def test_output_goes_to_the_cell_log_and_a_validator_bug_is_this_cells_error(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    def run_cell(cell: Cell, spec: Any, device: str, seed: int, workdir: Path) -> CellOutcome:
        print("printed by the op")
        os.write(2, b"written by C code\n")
        raise ValueError("boom\nsecond line")

    reply = worker.run_task(task(tmp_path), {"op": Spec()}, run_cell, "cpu")
    assert reply["outcome"]["verdict"] == "error"
    assert reply["outcome"]["reason"] == "validator raised ValueError: boom"
    assert reply["healthy"]
    log = (tmp_path / "cell.log").read_text()
    assert log.startswith(f"=== {CELL.id} attempt 1 seed 5 worker pid {os.getpid()} (cpu, cpu)")
    for text in ("printed by the op", "written by C code", "Traceback", "ValueError: boom"):
        assert text in log
    out, err = capfd.readouterr()
    assert "printed by the op" not in out + err  # nothing leaks past the cell's log
    assert (tmp_path / "work").is_dir()


def test_outcome_is_passed_on_as_strict_json(tmp_path: Path) -> None:
    def run_cell(cell: Cell, spec: Any, device: str, seed: int, workdir: Path) -> CellOutcome:
        assert (device, seed) == ("cpu", 5)
        check = CheckResult("correctness", Verdict.FAIL, "NaN out", {"err": math.nan})
        return CellOutcome([check], ["opgate::op"])

    reply = worker.run_task(task(tmp_path), {"op": Spec()}, run_cell, "cpu")
    wire = json.loads(json.dumps(worker.jsonable(reply), allow_nan=False))
    assert wire["outcome"]["verdict"] is None  # the parent combines the checks
    assert wire["outcome"]["checks"][0]["details"] == {"err": "nan"}
    assert wire["outcome"]["kernels"] == ["opgate::op"]


def test_sticky_device_error_fails_the_cell_and_the_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sticky = "sticky CUDA error after this cell: illegal address"
    monkeypatch.setattr(worker, "_health", lambda kind, tidy: sticky)

    def run_cell(cell: Cell, spec: Any, device: str, seed: int, workdir: Path) -> CellOutcome:
        assert device == "cuda:0"  # a cuda worker sees only its own GPU
        return CellOutcome([CheckResult("correctness", Verdict.PASS)])

    reply = worker.run_task(task(tmp_path), {"op": Spec()}, run_cell, "cuda")
    assert not reply["healthy"]
    assert reply["outcome"]["verdict"] == "error"
    assert reply["outcome"]["reason"].startswith("sticky CUDA error after this cell")


def test_unknown_op_is_an_error_not_a_crash(tmp_path: Path) -> None:
    reply = worker.run_task(task(tmp_path), {}, lambda *a: None, "cpu")
    assert reply["outcome"]["reason"] == "op 'op' has no spec in this worker"


class FakeCuda:
    """What :func:`worker.warm_cuda` touches of torch: an allocation on the device and a sync."""

    def __init__(self, fail: str = "") -> None:
        self.fail, self.calls = fail, list[str]()
        self.cuda = self

    def ones(self, n: int, device: str) -> FakeCuda:
        self.calls.append(f"ones({n}, {device})")
        if self.fail:
            raise RuntimeError(self.fail)
        return self

    def add_(self, x: int) -> FakeCuda:
        self.calls.append(f"add_({x})")
        return self

    def synchronize(self) -> None:
        self.calls.append("synchronize")


def test_a_cuda_worker_makes_its_context_before_hello_and_survives_a_dead_device(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    warmed: list[str] = []
    monkeypatch.setattr(worker, "warm_comparisons", lambda torch, device: warmed.append(device))
    ok = FakeCuda()
    worker.warm_cuda(ok)
    assert ok.calls == ["ones(1, cuda)", "add_(1)", "synchronize"]  # a kernel ran: the context exists
    assert warmed == ["cuda"]  # then the comparison's kernels
    monkeypatch.setenv(worker.WARM_COMPARISONS, "0")
    worker.warm_cuda(FakeCuda())
    assert warmed == ["cuda"]  # switched off
    dead = FakeCuda("CUDA error: no CUDA-capable device is detected")
    worker.warm_cuda(dead)  # the worker still says hello; the cell reports the device
    assert "CUDA did not start before the first cell: CUDA error: no CUDA-capable" in capsys.readouterr().err


def test_warming_the_comparison_runs_it_for_each_dtype_and_never_fails_the_worker(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    from opgate.validators import tolerance

    seen: list[tuple[torch.dtype, int, int]] = []
    real = tolerance.compare

    def spy(op: Any, ref: Any, oracle: Any, rule: Any, label: str = "output") -> Any:
        out = real(op, ref, oracle, rule, label)
        seen.append((op.dtype, out[0].op_nonfinite, out[0].oracle_nonfinite))
        return out

    monkeypatch.setattr(tolerance, "compare", spy)
    worker.warm_comparisons(torch, "cpu")
    # every dtype the matrix compares, through the non-finite branches too (a NaN of the op, an inf oracle)
    assert seen == [(torch.float32, 1, 1), (torch.float16, 1, 1), (torch.bfloat16, 1, 1)]
    assert capsys.readouterr().err == ""

    def broken(*_: Any, **__: Any) -> Any:
        raise TypeError("a comparison that changed its signature")

    monkeypatch.setattr(tolerance, "compare", broken)
    worker.warm_comparisons(torch, "cpu")  # said, not raised: the worker still says hello
    assert "comparison kernels were not loaded before the first cell: a comparison" in capsys.readouterr().err


@pytest.mark.parametrize("last", [False, True])
def test_a_throw_away_workers_cell_skips_the_tidying_for_a_next_cell(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, last: bool
) -> None:
    calls: list[str] = []

    def health(kind: str, tidy: bool) -> str:
        calls.append(f"health tidy={tidy}")
        return ""

    monkeypatch.setattr(worker, "_health", health)
    monkeypatch.setattr(worker, "_reset_between_cells", lambda: calls.append("reset"))

    def run_cell(cell: Cell, spec: Any, device: str, seed: int, workdir: Path) -> CellOutcome:
        return CellOutcome([CheckResult("correctness", Verdict.PASS)])

    reply = worker.run_task({**task(tmp_path), "last": last}, {"op": Spec()}, run_cell, "cuda")
    assert reply["healthy"]  # the device is checked either way: a sticky error is still this cell's
    assert calls == (["health tidy=False"] if last else ["health tidy=True", "reset"])
    assert "=== cell " in (tmp_path / "cell.log").read_text()  # where its time went, in its log
