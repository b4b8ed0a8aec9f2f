"""``opgate perf``: argument handling, the bench plan, the study's bookkeeping (CPU)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from opgate.matrix.spec import load_specs
from opgate.validators.perf.__main__ import main
from opgate.validators.perf.bench import BENCH_SHAPES_2D, Case, plan
from opgate.validators.perf.study import Session, StudyConfig, evaluate, meets_bar
from opgate.validators.perf.study import plan as study_plan


def test_bench_plan_for_row_wise_ops() -> None:
    cases = plan(load_specs(), ["rms_norm"])
    labels = [c.label for c in cases]
    assert len(cases) == 2 * (len(BENCH_SHAPES_2D) + 2)  # bf16 everywhere, fp16/fp32 at the largest
    assert "rms_norm 32768x8192 fp32 backward" in labels
    assert "rms_norm 8x4096 fp16 forward" not in labels
    assert cases[0] == Case("rms_norm", (8, 4096), "bf16", "forward")


def test_bench_plan_uses_spec_shapes_for_other_ranks_and_honours_filters() -> None:
    specs = load_specs()
    rope = plan(specs, ["rope"], directions=["forward"])
    assert {c.shape for c in rope} == {tuple(s) for s in specs["rope"].shapes["large"]}
    only = plan(specs, ["silu_mul"], shapes=[(4096, 4096)], dtypes=["fp16"], directions=["backward"])
    assert only == [Case("silu_mul", (4096, 4096), "fp16", "backward")]
    assert {c.op for c in plan(specs)} >= {"rms_norm", "silu_mul"}
    assert "matmul" not in {c.op for c in plan(specs)}  # library-backed: not a first-party op


def test_bench_plan_rejects_unknown_ops_and_directions() -> None:
    with pytest.raises(ValueError, match="not a first-party op: nope"):
        plan(load_specs(), ["nope"])
    with pytest.raises(ValueError, match="first-party"):
        plan(load_specs(), ["matmul"])
    with pytest.raises(ValueError, match="sideways"):
        plan(load_specs(), ["rms_norm"], directions=["sideways"])


def test_dry_run_prints_the_plan(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert (
        main(["bench", "--ops", "rms_norm", "--shape", "4096x4096", "--dry-run", "--out", str(tmp_path)]) == 0
    )
    out = capsys.readouterr().out.split("\n")
    assert "rms_norm 4096x4096 bf16 forward" in out
    assert "rms_norm 4096x4096 fp32 backward" in out  # the only shape is the largest


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bench", "--ops", "nope", "--dry-run", "--out", "x"], "not a first-party op"),
        (["bench", "--shape", "4096xA", "--out", "x"], "integers joined by x"),
        (["bench", "--shape", "0x5", "--out", "x"], "positive"),
        (["study", "--slowdown", "1.5", "--out", "x"], "between 0 and 1"),
        (["study", "--runs", "0", "--out", "x"], ">= 1"),
        (["block", "--heads", "3", "--out", "x"], "heads"),
        (["bench", "--dry-run"], "--out"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("command", ["bench", "study", "block"])
def test_gpu_commands_stop_clearly_on_cpu(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str
) -> None:
    assert main([command, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "needs a CUDA device" in err
    assert f"opgate perf {command}" in err
    assert not (tmp_path / "o").exists()


def test_study_plan_seeds_history_then_alternates() -> None:
    order = study_plan(StudyConfig(runs=3, history_runs=2))
    assert order == [("history", 0), ("history", 1), ("aa", 0), ("planted", 0), ("aa", 1), ("planted", 1),
                     ("aa", 2), ("planted", 2)]  # fmt: skip
    with pytest.raises(ValueError, match="runs"):
        StudyConfig(runs=0)


def _session(kind: str, index: int, rng: random.Random, level: float) -> Session:
    drift = level * (1 + rng.uniform(-0.01, 0.01))
    return Session(kind, index, [drift * rng.lognormvariate(0, 0.02) for _ in range(55)])


def test_study_evaluation_on_synthetic_sessions() -> None:
    rng = random.Random(5)
    config = StudyConfig(runs=20, history_runs=3)
    sessions = [_session(k, i, rng, 77.0 if k == "planted" else 70.0) for k, i in study_plan(config)]
    result = evaluate(sessions, config)
    summary = result["summary"]
    assert summary["aa_runs"] == summary["planted_runs"] == 20
    assert summary["aa_alerts"] <= 1
    assert summary["planted_caught"] >= 19
    assert summary["meets_bar"]
    # planted sessions never enter the history: the 20th A/A is judged against unchanged runs only
    assert all(v["ratio"] < 1.05 for v in result["verdicts"] if v["kind"] == "aa")


def test_study_without_a_real_slowdown_fails_the_bar() -> None:
    rng = random.Random(6)
    config = StudyConfig(runs=20, history_runs=3)
    sessions = [_session(k, i, rng, 70.0) for k, i in study_plan(config)]  # "planted" = no change
    summary = evaluate(sessions, config)["summary"]
    assert summary["planted_caught"] <= 1
    assert not summary["meets_bar"]
    assert meets_bar({"aa_alerts": 1, "aa_runs": 20, "planted_caught": 19, "planted_runs": 20})
    assert not meets_bar({"aa_alerts": 2, "aa_runs": 20, "planted_caught": 20, "planted_runs": 20})


@pytest.mark.integration
def test_peers_are_defined_once_with_their_roles() -> None:
    """opgate's implementations (the CUDA C++ one included) and their compiled variants, then aten,
    compile(reference) and Liger: one list, roles in the data, the unavailable with a reason."""
    from opgate.validators.perf.peers import ROLES, peers_for

    spec = load_specs()["rms_norm"]
    peers, missing = peers_for(spec)
    roles = {p.name: p.role for p in peers}
    assert set(roles.values()) <= set(ROLES)
    assert roles["opgate-triton"] == "opgate"
    assert roles["opgate-triton-compiled"] == "variant"
    assert roles["aten"] == roles["compile(reference)"] == "peer"
    # the CUDA C++ implementation is a peer column or says why it is not (no CUDA torch here)
    assert ("opgate-cuda" in roles) != ("opgate-cuda" in missing)
    assert ("liger" in roles) != ("liger" in missing)
    assert [p.name for p in peers] == list(dict.fromkeys(p.name for p in peers)), "one column per name"
