#!/usr/bin/env python3
"""Copy a wheel keeping only the native libraries a GPU run needs, so it fits what travels there.

Why: a prebuilt CUDA library's wheel bundles one ``.so`` per CUDA version
(bitsandbytes 0.50.2: 43 MB, nine CUDA builds and seven ROCm/XPU ones), more
than a runner's upload budget allows beside the checkout.  The kept files
are byte-identical: their RECORD lines (with the original sha256) are kept,
so the audit on the runner is of the very file the full wheel installs.

    python3 .ci/slim_wheel.py WHEEL OUTDIR --keep 'bitsandbytes/libbitsandbytes_cuda130.so' [--keep ...]

Every file that is not a shared library (``*.so``) is kept; a shared library
only when it matches a ``--keep`` glob.
"""

from __future__ import annotations

import argparse
import fnmatch
import sys
import zipfile
from pathlib import Path


def slim(wheel: Path, outdir: Path, keep: list[str]) -> Path:
    outdir.mkdir(parents=True, exist_ok=True)
    out = outdir / wheel.name
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        names = src.namelist()
        dropped = {n for n in names if n.endswith(".so") and not any(fnmatch.fnmatchcase(n, g) for g in keep)}
        for name in names:
            if name in dropped:
                continue
            data = src.read(name)
            if name.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines()
                data = ("\n".join(ln for ln in lines if ln.split(",", 1)[0] not in dropped) + "\n").encode()
            dst.writestr(src.getinfo(name), data)
    print(f"{out}: kept {len(names) - len(dropped)} files, dropped {len(dropped)} libraries", file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("wheel", type=Path)
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--keep", action="append", default=[], help="glob of a shared library to keep")
    args = parser.parse_args(argv)
    if not args.wheel.is_file():
        parser.error(f"{args.wheel}: no such wheel")
    slim(args.wheel, args.outdir, args.keep)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
