"""``opgate publish``: merge runs and write compat.json, compat.md, index.html.

All-or-nothing: every check (merge conflicts, missing shards, schema) runs and
every file is rendered into a temporary folder *before* anything in OUT is
touched, so a refused publish leaves the previously published matrix exactly
as it was (the nightly page never shows half a run).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from opgate.reports import bench_table, block_report, html, markdown
from opgate.reports import compat as compat_mod
from opgate.reports.merge import check_manifest, merge, read_runs
from opgate.reports.view import terminal_summary

OUTPUT_FILES = ("compat.json", "compat.md", "index.html")


def render_all(doc: compat_mod.Compat, block: dict[str, Any] | None = None) -> dict[str, str]:
    """Every published file's text (compat.json validated against its schema on the way)."""
    extra = block_report.render_html(block) if block is not None else ""
    return {
        "compat.json": compat_mod.dumps(doc),
        "compat.md": markdown.render(doc),
        "index.html": html.render(doc, block_section=extra),
    }


def _install(files: dict[str, str], out: Path) -> None:
    """Write into a temp folder next to OUT, then move each file in with an atomic rename."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        for name, text in files.items():
            (tmp / name).write_text(text, encoding="utf-8")
        if not out.exists():
            tmp.rename(out)
            return
        for name in files:
            (tmp / name).replace(out / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def publish(
    inputs: Sequence[Path],
    out: Path,
    *,
    manifest: Path | None = None,
    history: Path | None = None,
    stream: TextIO | None = None,
    bench: Sequence[Path] = (),
    block: Path | None = None,
) -> compat_mod.Compat:
    """Merge ``inputs`` and publish to ``out``; raises before writing anything on any problem.

    ``bench``: committed benchmark JSON files; their table becomes ``bench.md`` and a
    section of ``compat.md``, so release notes carry the performance figures too.
    ``block``: the decoder block's ``block.json``; published as ``block.md``, a section
    of ``compat.md`` and one of ``index.html``.
    """
    merged = merge(read_runs(inputs))
    if manifest is not None:
        check_manifest(merged, manifest)
    previous = compat_mod.load(history) if history is not None else None
    doc = compat_mod.build(merged, previous)
    block_data = block_report.load(block) if block is not None else None
    files = render_all(doc, block_data)
    if bench:
        table = bench_table.render(bench_table.load(bench))
        files["bench.md"] = table
        files["compat.md"] += "\n## Benchmarks\n\n" + table.split("\n", 1)[1].lstrip("\n")
    if block_data is not None:
        files["block.md"] = block_report.render_md(block_data)
        files["compat.md"] += "\n## End to end\n\n" + files["block.md"]
    _install(files, out)
    if stream is not None:
        stream.write(terminal_summary(doc.entries, doc.environments) + "\n")
        stream.write(f"published {', '.join(str(out / n) for n in OUTPUT_FILES)}\n")
    return doc
