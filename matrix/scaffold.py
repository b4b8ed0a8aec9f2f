"""``opgate init DIR --name my_op``: a new op folder whose cells pass on CPU as generated.

The folder holds everything a spec names — ``spec.yaml``, the reference and
its sample inputs, a Triton kernel registered with ``torch.library.triton_op``
+ ``wrap_triton`` (fake implementation and autograd included), and a pytest
file — so a team starts from an op that validates and changes it into theirs.

The template lives with the matrix stage, which owns the spec format, and not
under ``ops/``: that folder is opgate's payload, and every ``ops/*/spec.yaml``
there is discovered as one of opgate's own ops.  Module references in the
generated spec are written the way the op will be imported: from the import
root of ``DIR`` (:func:`matrix.spec_refs.import_root`), so ``opgate init ops``
in a repository whose package is ``ops`` writes ``ops.my_op.reference:...``.
"""

from __future__ import annotations

import argparse
import keyword
import os
import re
import string
import sys
from collections.abc import Sequence
from pathlib import Path

from opgate.matrix.errors import OpgateError, UsageError
from opgate.matrix.json_schemas import SCHEMAS_DIR
from opgate.matrix.spec_refs import import_root
from opgate.matrix.spec_schema import NAME_PATTERN, OPS_DIR

TEMPLATE_DIR = Path(__file__).resolve().parent / "templates" / "op"
#: template file -> the file it becomes (``{name}`` is the op name)
FILES = {
    "__init__.py.tmpl": "__init__.py",
    "spec.yaml.tmpl": "spec.yaml",
    "reference.py.tmpl": "reference.py",
    "triton_impl.py.tmpl": "triton_impl.py",
    "test_op.py.tmpl": "test_{name}.py",
}


def _identifier(text: str) -> str:
    """A torch.library namespace from a folder name: lower case, ``[a-z0-9_]``, not starting with a digit."""
    ns = re.sub(r"[^a-z0-9_]+", "_", text.lower()).strip("_") or "my_ops"
    return ns if ns[0].isalpha() else f"ops_{ns}"


def _schema_ref(spec_dir: Path) -> str:
    """The editor schema: relative when it lies in the op's own repository, else an absolute path."""
    schema = SCHEMAS_DIR / "spec.schema.json"
    repo = next((p for p in (spec_dir, *spec_dir.parents) if (p / ".git").exists()), None)
    if repo is not None and schema.is_relative_to(repo):
        return Path(os.path.relpath(schema, spec_dir)).as_posix()
    return schema.as_posix()


def _check_name(name: str) -> None:
    if not re.fullmatch(NAME_PATTERN, name) or keyword.iskeyword(name):
        raise UsageError(f"--name {name!r}: an op name is [a-z][a-z0-9_]* and not a Python keyword")
    if (OPS_DIR / name / "spec.yaml").exists():
        raise UsageError(f"--name {name!r}: opgate ships an op of that name; choose another")


def _check_not_shadowing(top: str, root: Path) -> None:
    """The op's top-level package must not be a module installed or in the standard library.

    ``opgate init ops --name torch`` in a folder ``ops`` with no ``__init__.py``
    makes ``torch`` the op's package: its spec would import it instead of
    PyTorch, and every cell would fail for no reason the op author can see.
    A package of the team's own (already under ``root``) is theirs to extend.
    """
    import importlib.util

    try:
        found = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return
    if found is None:
        return
    where = found.origin or ""
    places = [where] if where else list(found.submodule_search_locations or ())  # a namespace package
    if any(Path(p).resolve().is_relative_to(root) for p in places):
        return
    what = where or "a namespace package"
    raise UsageError(
        f"the op's package would be {top!r}, which is already a module here ({what}): its spec would "
        "import that one; choose another --name or give the folder an __init__.py"
    )


def scaffold(directory: Path, name: str, namespace: str | None = None) -> list[Path]:
    """Write ``directory/name/`` from the template; returns the files written."""
    _check_name(name)
    directory = directory.resolve()
    target = directory / name
    if target.exists():
        raise UsageError(f"{target} already exists; opgate init never overwrites")
    root = import_root(directory)
    parts = target.relative_to(root).parts
    if not all(part.isidentifier() for part in parts):
        raise UsageError(f"{target}: {'.'.join(parts)!r} is not a module path (each folder a Python name)")
    package = ".".join(parts)
    _check_not_shadowing(parts[0], root)
    namespace = namespace or _identifier(root.name)
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", namespace):
        raise UsageError(f"--namespace {namespace!r}: a torch.library namespace is [a-z_][a-z0-9_]*")
    values = {
        "name": name,
        "namespace": namespace,
        "module": package,
        "ops_path": os.path.relpath(directory, Path.cwd()),
        "schema": _schema_ref(target),
    }
    target.mkdir(parents=True)
    written = []
    for template, out_name in FILES.items():
        text = string.Template((TEMPLATE_DIR / template).read_text(encoding="utf-8")).substitute(values)
        path = target / out_name.format(name=name)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="opgate init", description=__doc__.split("\n", 1)[0])
    parser.add_argument("dir", type=Path, metavar="DIR", help="the folder of op folders (an --ops-path)")
    parser.add_argument("--name", required=True, help="op name, [a-z][a-z0-9_]* (the new folder's name)")
    parser.add_argument(
        "--namespace", default=None, help="torch.library namespace (default: the import root's folder name)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        written = scaffold(args.dir, args.name, args.namespace)
    except OpgateError as err:
        print(f"opgate init: {err.message()}", file=sys.stderr)
        return err.exit_code
    ops_path = os.path.relpath(args.dir.resolve(), Path.cwd())
    print("\n".join(f"  wrote {os.path.relpath(p, Path.cwd())}" for p in written))
    print(
        f"next: opgate run --ops-path {ops_path} --select '{args.name}.*' --out out/{args.name}\n"
        f"      (on CPU, Triton kernels run under its interpreter; pip install triton if torch has none)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
