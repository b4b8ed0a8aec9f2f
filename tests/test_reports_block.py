"""The decoder-block comparison in the published report, rendered from the committed H200 result."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from opgate.matrix.errors import ResultsFormatError
from opgate.reports import block_report
from opgate.reports.__main__ import main as reports_main
from tests.data.reports.fixtures import cpu_run, write_run

BLOCK = Path(__file__).resolve().parents[1] / "results" / "runs" / "h200-block" / "block.json"


def test_markdown_has_parity_times_speedups_and_the_flag_line() -> None:
    data = block_report.load(BLOCK)
    md = block_report.render_md(data)
    fwd = data["blocks"]["forward"]
    ours, stock = fwd["opgate/eager"]["median_us"], fwd["torch/eager"]["median_us"]
    assert f"| opgate/eager | {data['parity_relerr']['opgate/eager']:.2e} | {ours:.1f} |" in md
    assert f"{stock / ours:.2f}x faster" in md  # speed-up over stock PyTorch in the same mode
    assert "| rms_norm |" in md
    assert "No op is faster alone yet slower in the block." in md


def test_a_flag_and_a_slower_block_are_shown(tmp_path: Path) -> None:
    data = copy.deepcopy(block_report.load(BLOCK))
    step = data["blocks"]["step"]
    step["opgate/compile"]["median_us"] = 2 * step["torch/compile"]["median_us"]
    data["flags"] = [{"flag": "faster alone, slower in the block", "op": "silu_mul", "mode": "compile"}]
    md = block_report.render_md(data)
    assert "100% slower" in md
    assert "**faster alone, slower in the block**: silu_mul (compile)" in md
    html = block_report.render_html(data)
    assert "faster alone, slower in the block: silu_mul (compile)" in html
    assert "<script" not in html


def test_publish_puts_the_block_in_compat_md_and_index_html(tmp_path: Path) -> None:
    run = write_run(cpu_run(), tmp_path / "cpu")
    out = tmp_path / "out"
    assert reports_main(["publish", "--in", str(run), "--out", str(out), "--block", str(BLOCK)]) == 0
    assert (out / "block.md").read_text().startswith("### Decoder block")
    assert "## End to end" in (out / "compat.md").read_text()
    assert 'id="block"' in (out / "index.html").read_text()


def test_a_file_that_is_not_a_block_result_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "block.json"
    bad.write_text(json.dumps({"config": {}}))
    with pytest.raises(ResultsFormatError, match="not a decoder-block result"):
        block_report.load(bad)
    run = write_run(cpu_run(), tmp_path / "cpu")
    code = reports_main(["publish", "--in", str(run), "--out", str(tmp_path / "o"), "--block", str(bad)])
    assert code == ResultsFormatError.exit_code
    assert not (tmp_path / "o").exists()  # nothing published
