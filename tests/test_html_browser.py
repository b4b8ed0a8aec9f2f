"""index.html in a real headless Chromium: data loading, filters, cell links, file:// handling.

The page is served the way GitHub Pages serves it (a real HTTP server on
loopback, index.html and compat.json side by side) and driven over the
DevTools protocol (tests/devtools.py).  The evidence view has its own module
(tests/test_html_evidence_browser.py).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from opgate.reports.publish import publish
from opgate.reports.view import cell_url
from tests.data.reports.fixtures import (
    ERROR_CELL,
    FAIL_CELL,
    FALLBACK_CELL,
    HOSTILE_REASON,
    cpu_run,
    gpu_run,
    write_run,
)
from tests.devtools import Page, launch, serve

pytestmark = pytest.mark.browser
ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = ROOT / "results" / "published"
LOADED = "document.getElementById('load-status').dataset.state !== 'loading'"


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Page]:
    yield from launch(tmp_path_factory.mktemp("chromium-profile"))


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """A published folder ``out`` (with perf history) and the committed one, served over HTTP."""
    root = tmp_path_factory.mktemp("site")
    base = publish([write_run(cpu_run(), root / "cpu"), write_run(gpu_run(), root / "gpu")], root / "base")
    assert base.entries
    head_in = [write_run(cpu_run(), root / "cpu2"), write_run(gpu_run(slowdown=1.1, seed=3), root / "gpu2")]
    publish(head_in, root / "out", history=root / "base" / "compat.json")
    (root / "committed").symlink_to(PUBLISHED, target_is_directory=True)
    with serve(root) as url:
        yield root, url


def expected_slots(compat: dict[str, Any], **filters: str) -> int:
    """Visible slots computed from compat.json, independently of the page's script."""
    slots: set[tuple[str, ...]] = set()
    for cell in compat["cells"]:
        axes = cell["axes"]
        values = {**axes, "verdict": cell["verdict"], "row": f"{axes['op']}/{axes['impl']}"}
        if all(values[k] == v for k, v in filters.items()):
            column = (axes["torch"], axes["cuda"], axes["arch"])
            slots.add(
                (
                    axes["op"],
                    axes["impl"],
                    axes["dtype"],
                    axes["layout"],
                    axes["shapes"],
                    *column,
                    axes["mode"],
                )
            )
    return len(slots)


def set_filter(page: Page, name: str, value: str) -> int:
    page.eval(
        f"(() => {{ const s = document.getElementById('f-{name}'); s.value = {json.dumps(value)};"
        " s.dispatchEvent(new Event('change')); })()"
    )
    return int(page.eval("document.querySelectorAll('#matrix .slot').length"))


def open_page(page: Page, url: str) -> str:
    """Navigate and wait until the page has loaded its data (or said why not); return the state."""
    page.open(url)
    page.wait_for(LOADED)
    return str(page.eval("document.getElementById('load-status').dataset.state"))


def details_id(page: Page) -> str | None:
    if page.eval("document.getElementById('details').hidden"):
        return None
    return str(page.eval("document.getElementById('details-id').textContent"))


def test_dashboard_loads_compat_json_filters_and_opens_a_failing_cell(
    browser: Page, site: tuple[Path, str]
) -> None:
    root, url = site
    compat = json.loads((root / "out" / "compat.json").read_text())
    before = len(browser.errors())
    assert open_page(browser, f"{url}/out/index.html") == "loaded"

    assert browser.errors()[before:] == []
    assert browser.eval("document.title").startswith("opgate compatibility matrix")
    total = int(browser.eval("document.querySelectorAll('#matrix .slot').length"))
    assert total == expected_slots(compat) > 20

    # Filters change what is visible, to exactly the matching cells.
    assert set_filter(browser, "verdict", "fail") == expected_slots(compat, verdict="fail") == 1
    assert browser.eval("[...document.querySelectorAll('#matrix .slot')].map(b => b.dataset.cell)") == [
        FAIL_CELL
    ]
    assert set_filter(browser, "verdict", "") == total
    assert (
        set_filter(browser, "op", "silu_mul/triton") == expected_slots(compat, row="silu_mul/triton") < total
    )
    assert set_filter(browser, "mode", "compile") == expected_slots(
        compat, row="silu_mul/triton", mode="compile"
    )
    assert browser.eval(f"!!document.querySelector('.slot[data-cell=\"{ERROR_CELL}\"]')")
    browser.eval("document.getElementById('f-reset').click()")
    assert int(browser.eval("document.querySelectorAll('#matrix .slot').length")) == total

    # Clicking the failing cell opens its evidence; the hostile reason is shown as text, never run.
    assert details_id(browser) is None
    browser.click(f'.slot[data-cell="{FAIL_CELL}"]')
    assert details_id(browser) == FAIL_CELL
    details = browser.eval("document.getElementById('details').innerText")
    assert "correctness" in details
    assert "opgate run --select" in details
    assert "max_abs_err" in details
    assert HOSTILE_REASON.split(" </script>")[0] in details
    assert "</script><script>window.__pwned=1</script>" in details
    assert browser.eval("typeof window.__pwned") == "undefined"

    # Perf charts are inline SVG, with a history line for the re-measured series.
    assert int(browser.eval("document.querySelectorAll('#perf svg.chart').length")) >= 2
    assert int(browser.eval("document.querySelectorAll('#perf svg.history polyline').length")) >= 1

    # The page read compat.json from its own folder and nothing from anywhere else.
    assert browser.errors()[before:] == []
    requested = [u for u in browser.requested_urls() if u.startswith(url) or "://" in u]
    assert f"{url}/out/compat.json" in requested
    assert [u for u in requested if not u.startswith((f"{url}/", "data:"))] == []


def test_every_cell_link_opens_that_cell(browser: Page, site: tuple[Path, str]) -> None:
    _, url = site
    page = f"{url}/out/index.html"
    # A link from a PR comment or an alert (the URL opgate's diff and alerts write) opens the cell.
    assert open_page(browser, cell_url(page, FAIL_CELL)) == "loaded"
    assert details_id(browser) == FAIL_CELL
    assert browser.eval(
        f"document.querySelector('.slot[data-cell=\"{FAIL_CELL}\"]').classList.contains('target')"
    )
    assert browser.eval("document.getElementById('details-link').href") == cell_url(page, FAIL_CELL)

    # Following another cell's link on the open page: hashchange, no reload.
    browser.eval("window.__same_page = 1")
    browser.eval(f"location.hash = {json.dumps(cell_url('', ERROR_CELL))}")
    browser.wait_for(f"document.getElementById('details-id').textContent === {json.dumps(ERROR_CELL)}")
    assert browser.eval("window.__same_page") == 1

    # A cell hidden by a filter: the filters give way and the cell opens.
    set_filter(browser, "verdict", "pass")
    assert not browser.eval(f"!!document.querySelector('.slot[data-cell=\"{FALLBACK_CELL}\"]')")
    browser.eval(f"location.hash = {json.dumps(cell_url('', FALLBACK_CELL))}")
    browser.wait_for(f"document.getElementById('details-id').textContent === {json.dumps(FALLBACK_CELL)}")
    assert browser.eval("document.getElementById('f-verdict').value") == ""

    # Clicking a slot gives the address bar that cell's link; Back returns to the previous one.
    browser.click(f'.slot[data-cell="{ERROR_CELL}"]')
    assert browser.eval("location.href") == cell_url(page, ERROR_CELL)
    assert details_id(browser) == ERROR_CELL
    browser.eval("history.back()")
    browser.wait_for(f"document.getElementById('details-id').textContent === {json.dumps(FALLBACK_CELL)}")

    # A link to a cell this matrix does not hold says so instead of showing nothing.
    browser.eval(
        f"location.hash = {json.dumps(cell_url('', 'no_such_op.x-pt2.13-cpu-fp32-contiguous-eager'))}"
    )
    browser.wait_for("document.getElementById('load-status').innerText.includes('No cell no_such_op')")


def test_from_a_file_the_page_says_why_and_loads_the_chosen_compat_json(
    browser: Page, site: tuple[Path, str]
) -> None:
    root, _ = site
    compat = json.loads((root / "out" / "compat.json").read_text())
    before = len(browser.errors())
    assert open_page(browser, (root / "out" / "index.html").as_uri() + "#cell=" + FAIL_CELL) == "failed"
    notice = browser.eval("document.getElementById('load-status').innerText")
    assert "Opened from a file" in notice
    assert f"python3 -m http.server --directory '{root / 'out'}' 8000" in notice
    assert int(browser.eval("document.querySelectorAll('#matrix .slot').length")) == 0
    # The summary and the charts are part of the page: they show without the data.
    assert "rms_norm/triton" in browser.eval("document.getElementById('summary').innerText")
    assert browser.errors()[before:] == [], "a file: page must not even try the fetch"

    browser.set_files("#load-file", [root / "out" / "compat.json"])
    browser.wait_for("document.getElementById('load-status').dataset.state === 'loaded'")
    assert int(browser.eval("document.querySelectorAll('#matrix .slot').length")) == expected_slots(compat)
    assert details_id(browser) == FAIL_CELL  # the link in the address bar still applies


def test_a_missing_or_foreign_compat_json_is_reported(browser: Page, site: tuple[Path, str]) -> None:
    root, url = site
    lone = root / "lone"
    lone.mkdir(exist_ok=True)
    (lone / "index.html").write_bytes((root / "out" / "index.html").read_bytes())
    assert open_page(browser, f"{url}/lone/index.html") == "failed"
    assert "Could not load compat.json (HTTP 404)" in browser.eval(
        "document.getElementById('load-status').innerText"
    )

    # index.html of one publish beside compat.json of another: shown, with a warning.
    other = json.loads((root / "out" / "compat.json").read_text())
    other["generated_at"] = "2020-01-01T00:00:00Z"
    (lone / "compat.json").write_text(json.dumps(other))
    assert open_page(browser, f"{url}/lone/index.html") == "loaded"
    assert "was published 2020-01-01T00:00:00Z" in browser.eval(
        "document.getElementById('load-status').innerText"
    )
    # (another folder: the server answers "not modified" for a file rewritten within its second)
    foreign = root / "foreign"
    foreign.mkdir(exist_ok=True)
    (foreign / "index.html").write_bytes((root / "out" / "index.html").read_bytes())
    other["schema_version"] = 99
    (foreign / "compat.json").write_text(json.dumps(other))
    assert open_page(browser, f"{url}/foreign/index.html") == "failed"
    assert "schema_version 99" in browser.eval("document.getElementById('load-status').innerText")


def test_the_committed_published_page_loads_with_its_gpu_column_charts_and_block(
    browser: Page, site: tuple[Path, str]
) -> None:
    """results/published as committed: H200 and CPU environments, perf history, the block."""
    _, url = site
    compat = json.loads((PUBLISHED / "compat.json").read_text())
    before = len(browser.errors())
    assert open_page(browser, f"{url}/committed/index.html") == "loaded"
    assert browser.errors()[before:] == []
    assert int(browser.eval("document.querySelectorAll('#matrix .slot').length")) == expected_slots(compat)
    assert "sm_90 (H200)" in browser.eval("document.getElementById('summary').innerText")
    assert int(browser.eval("document.querySelectorAll('#perf svg.history polyline').length")) >= 1
    # Every committed perf point ran at a shape far below a launch's cost: no false "0%" bar.
    perf = browser.eval("document.getElementById('perf').textContent")
    assert "n/a (shape too small)" in perf
    assert int(browser.eval("document.querySelectorAll('#perf rect.bar-roof').length")) == 0
    block = browser.eval("document.getElementById('block').innerText")
    assert "opgate/eager" in block
    assert "torch/compile" in block
    assert int(browser.eval("document.querySelectorAll('#block .bar').length")) == 8  # 4 variants x 2 phases


def test_error_detection_catches_a_broken_page(browser: Page, tmp_path: Path) -> None:
    """The console-error check itself can fail: a page that throws is reported."""
    page = tmp_path / "broken.html"
    page.write_text("<!DOCTYPE html><title>x</title><script>console.error('boom'); undefinedFn();</script>")
    before = len(browser.errors())
    browser.open(page.as_uri())
    new = browser.errors()[before:]
    assert any("undefinedFn" in e for e in new), new
    assert any("boom" in e for e in new)


def test_expected_slots_counts_multi_environment_cells_once() -> None:
    doc: dict[str, Any] = defaultdict(list)
    names = ("op", "impl", "torch", "cuda", "arch", "dtype", "layout", "mode", "shapes")
    axes = dict(
        zip(names, ("a", "t", "2.13.0", "13.0", "sm_90", "all", "all", "build", "default"), strict=True)
    )
    doc["cells"] = [{"axes": axes, "verdict": "pass"}, {"axes": axes, "verdict": "fail"}]
    assert expected_slots(doc) == 1
    assert expected_slots(doc, verdict="fail") == 1
