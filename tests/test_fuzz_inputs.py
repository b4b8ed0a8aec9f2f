"""Fuzz suite: hundreds of malformed configs, specs, results files and argument sets, zero tracebacks.

Every case (tests/fuzz_inputs.py, tests/fuzz_results.py) runs the real
``opgate`` dispatcher in-process, the way the console command does (the
stage's ``main`` with its one error path), and must end with its documented
exit code (3 config/spec, 7 unreadable results, 2 usage or an unwritable
output, 4 empty selection), a message naming the file (and ``file:line``
where the input has lines), no traceback, within a second of CPU.  In-process is
faithful here: nothing in these paths forks or touches signals, and an
exception escaping ``main`` fails the case with its traceback.

The alias-bomb family is also measured where memory is honest, in a fresh
interpreter per depth (tracemalloc peak and the process's max RSS).
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import resource
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from opgate.reports import cli
from tests.data.reports.fixtures import regression_diff
from tests.fuzz_inputs import ROOT, VALID, Case, alias_bomb, config_cases, spec_cases
from tests.fuzz_results import argument_cases, results_cases, state_cases

CASES: list[Case] = [*config_cases(), *spec_cases(), *results_cases(), *state_cases(), *argument_cases()]
#: A closed loopback port: a case that wrongly tried to post would end 8, not its expected code.
NOWHERE = "http://127.0.0.1:9/hook/abcdefghijkl"


def test_the_suite_is_large_and_names_are_unique() -> None:
    assert len(CASES) >= 150
    assert len({c.name for c in CASES}) == len(CASES)


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Case folders live here, beside ``_valid/`` (a compat.json and a diff.json cases may read)."""
    base = tmp_path_factory.mktemp("fuzz")
    valid = base / VALID
    valid.mkdir()
    regression_diff(valid)
    (valid / "compat.json").write_bytes((valid / "head" / "compat.json").read_bytes())
    return base


def invoke(argv: list[str]) -> tuple[int, str, str]:
    """``opgate ARGV`` in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as exc:  # argparse's own usage errors
            code = exc.code if isinstance(exc.code, int) else 2
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_ends_in_one_line_and_its_exit_code(
    case: Case, shared: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = shared / f"{CASES.index(case):03d}-{re.sub(r'[^A-Za-z0-9_.-]+', '_', case.name)[:60]}"
    root.mkdir(parents=True)
    for var in ("OPGATE_WEBHOOK_URL", "OPGATE_SLACK_WEBHOOK_URL"):
        monkeypatch.setenv(var, NOWHERE)
    monkeypatch.setenv("XDG_STATE_HOME", str(root / "state"))
    call = case.build(root)
    t0, cpu0 = time.perf_counter(), time.process_time()
    code, _, err = invoke(call.argv)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    assert "Traceback" not in err
    assert code in case.codes, f"exit {code}, expected {case.codes}: {err}"
    assert err.strip(), "a refusal says why"
    if call.names is not None:
        assert str(call.names) in err, err
    if call.line:
        assert re.search(re.escape(str(call.names)) + r":\d+", err), err
    assert cpu < 1.0, f"{cpu:.2f} s of CPU"  # CPU, not wall: CI machines are shared
    assert seconds < 10.0, f"{seconds:.2f} s"  # nothing waits (a FIFO, a retry, a lock)


BOMB_PROBE = textwrap.dedent(
    """
    import json, sys, time, tracemalloc
    from pathlib import Path
    from opgate.matrix.errors import ConfigError
    from opgate.matrix.yamlload import load_yaml
    path = Path(sys.argv[1])
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        load_yaml(path)
        outcome = "loaded"
    except ConfigError as err:
        outcome = err.message()
    seconds = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    # VmHWM, not ru_maxrss: the latter keeps the forking parent's (pytest's) peak across exec
    hwm = next(ln for ln in Path("/proc/self/status").read_text().splitlines() if ln.startswith("VmHWM"))
    rss = int(hwm.split()[1]) * 1024
    print(json.dumps({"outcome": outcome, "seconds": seconds, "peak": peak, "rss": rss}))
    """
)


@pytest.mark.integration
@pytest.mark.parametrize("levels", [3, 4, 5, 6, 8, 10, 12, 16])
def test_alias_bomb_is_refused_fast_and_small_at_every_depth(levels: int, tmp_path: Path) -> None:
    """9**levels values from a few hundred bytes: refused with file:line in < 1 s and < 100 MB."""
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("matrix_version: 1\n" + alias_bomb(levels))
    assert bomb.stat().st_size < 2048
    probe = subprocess.run(
        [sys.executable, "-c", BOMB_PROBE, str(bomb)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    found = json.loads(probe.stdout)
    assert found["outcome"].startswith(f"{bomb}:"), found
    assert "aliases are followed" in found["outcome"]
    assert found["seconds"] < 1.0
    assert found["peak"] < 100 * 2**20
    assert found["rss"] < 100 * 2**20


def test_the_same_document_without_its_aliases_still_loads(tmp_path: Path) -> None:
    """The bound is on expansion, not on aliases: a few small aliases are fine."""
    doc = tmp_path / "ok.yaml"
    doc.write_text("matrix_version: 1\n" + alias_bomb(2))  # 9**3 values: within the bound
    code, _, err = invoke(["list", "--config", str(doc)])
    assert code == 3  # the lolN keys are unknown matrix keys: a schema error, not a limit
    assert "unknown key 'lol0'" in err
    assert "aliases" not in err


def _file_size_limit(limit: int) -> None:
    """In the child: writes past ``limit`` bytes fail with EFBIG, like a disk that is full."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


@pytest.mark.integration
def test_publish_onto_a_full_disk_is_one_line_and_leaves_the_published_folder(shared: Path) -> None:
    """A disk that fills up while the matrix is written: exit 2 naming OUT, the old files intact."""
    from tests.fuzz_inputs import RESULTS

    out = shared / "full-disk" / "report"
    argv = [sys.executable, "-m", "opgate.reports", "publish", "--in", str(RESULTS.parent), "--out", str(out)]
    assert subprocess.run(argv, cwd=ROOT, capture_output=True, check=False).returncode == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    (shared / "full-disk" / "fresh").mkdir()
    for target in (out, shared / "full-disk" / "fresh" / "report"):
        full = subprocess.run(
            [*argv[:-1], str(target)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
            preexec_fn=lambda: _file_size_limit(16 * 1024),
        )
        assert full.returncode == 2, full.stderr
        assert f"cannot write {target}: File too large" in full.stderr
        assert "Traceback" not in full.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert not (shared / "full-disk" / "fresh" / "report").exists()
    assert [p.name for p in (shared / "full-disk").iterdir() if p.name.startswith(".")] == []
