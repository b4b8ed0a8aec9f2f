"""``opgate publish``: merge runs and write compat.json, compat.md, index.html.

All-or-nothing: every check (merge conflicts, missing shards, schema) runs and
every file is rendered into a temporary folder *before* anything in OUT is
touched, so a refused publish leaves the previously published matrix exactly
as it was (the nightly page never shows half a run).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from opgate.matrix.errors import MissingShard, OutputError
from opgate.reports import bench_table, block_report, html, markdown
from opgate.reports import compat as compat_mod
from opgate.reports.completeness import notice
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


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _install(files: dict[str, str], out: Path) -> None:
    """Write into a temp folder next to OUT, then move each file in with an atomic rename.

    The temp folder (``mkdtemp``: mode 0700) becomes OUT itself on a first
    publish, so it gets the mode ``mkdir`` would have given it (0777 less the
    umask) before it is renamed into place: a published folder is readable
    by whoever may read its parent, like any other.
    """
    if out.exists() and not out.is_dir():
        raise OutputError(f"--out {out}: is a file, not a folder")
    for name in files:  # checked before the first file moves in: a refused publish replaces none
        if (out / name).is_dir():
            raise OutputError(f"--out {out}: {name} there is a folder, where opgate publishes a file")
    try:
        _swap_in(files, out)
    except OSError as exc:
        raise OutputError(f"cannot write {out}: {exc.strerror or exc}") from None


def _swap_in(files: dict[str, str], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        for name, text in files.items():
            (tmp / name).write_text(text, encoding="utf-8")
        if not out.exists():
            tmp.chmod(0o777 & ~_umask())
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
    strict: bool = False,
) -> compat_mod.Compat:
    """Merge ``inputs`` and publish to ``out``; raises before writing anything on any problem.

    ``bench``: committed benchmark JSON files; their table becomes ``bench.md`` and a
    section of ``compat.md``, so release notes carry the performance figures too.
    ``block``: the decoder block's ``block.json``; published as ``block.md``, a section
    of ``compat.md`` and one of ``index.html``.
    ``strict``: refuse (:class:`MissingShard`) when a run lists planned cells without a verdict;
    otherwise such a matrix is published marked incomplete.
    """
    merged = merge(read_runs(inputs))
    if manifest is not None:
        check_manifest(merged, manifest)
    if strict and merged.missing:
        raise MissingShard(f"refusing to publish (--strict): {notice(merged.missing)}")
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
        if doc.missing:
            stream.write(notice(doc.missing) + "\n")
        stream.write(f"published {', '.join(str(out / n) for n in OUTPUT_FILES)}\n")
    return doc
