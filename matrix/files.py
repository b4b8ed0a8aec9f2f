"""Reading the files users hand opgate: bounded, regular files only, one error per stage.

Every stage reads files someone else wrote: a matrix config, op specs, a
shard's ``results.json``, last night's ``compat.json``, an alert state.  A
careless path (``/dev/zero``, a FIFO, a directory, a 2 GB log renamed
``.json``) or a damaged file must end in one line naming the file (and the
line, where there is one) with the stage's exit code, never a hang, a memory
blow-up or a traceback.  So every such read goes through :func:`read_text` /
:func:`read_json`, which refuse anything but a regular file, read at most
``limit`` bytes, decode strict UTF-8 and turn every decoding problem
(syntax, a 5000-digit integer, nesting deeper than Python's stack) into the
caller's error class: :class:`~matrix.errors.ConfigError` (exit 3) for
configs and specs, :class:`~matrix.errors.ResultsFormatError` (exit 7) for
results.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from opgate.matrix.errors import ConfigError, Location, OpgateError, OutputError, ResultsFormatError

#: Largest YAML document (matrix config, op spec) read; real ones are a few KB.
MAX_YAML_BYTES = 1 << 20
#: Largest JSON document read; a published compat.json of the full matrix is ~15 MB.
MAX_JSON_BYTES = 1 << 29


def problem(error: type[OpgateError], path: Path | str, text: str, line: int | None = None) -> OpgateError:
    """``error`` for ``path[:line]: text`` (ConfigError keeps the place as its :class:`Location`)."""
    if issubclass(error, ConfigError) and line:
        return error(text, Location(str(path), line))
    where = f"{path}:{line}" if line else str(path)
    return error(f"{where}: {text}")


def read_bytes(path: Path, *, what: str, limit: int, error: type[OpgateError]) -> bytes:
    """The bytes of regular file ``path`` (at most ``limit``), or ``error`` saying why not."""
    try:
        info = Path(path).stat()
    except OSError as exc:
        raise problem(error, path, f"cannot read {what}: {exc.strerror or exc}") from None
    if stat.S_ISDIR(info.st_mode):
        raise problem(error, path, f"is a directory, not {what}")
    if not stat.S_ISREG(info.st_mode):  # a FIFO would block, /dev/zero never ends
        raise problem(error, path, f"is not a regular file (a FIFO, device or socket), not {what}")
    if info.st_size > limit:
        raise problem(error, path, f"{what} is {info.st_size} bytes; opgate reads at most {limit}")
    try:
        with Path(path).open("rb") as handle:
            data = handle.read(limit + 1)
    except OSError as exc:
        raise problem(error, path, f"cannot read {what}: {exc.strerror or exc}") from None
    if len(data) > limit:  # grew while we looked
        raise problem(error, path, f"{what} is over {limit} bytes; opgate reads at most {limit}")
    return data


def decode(data: bytes, path: Path | str, *, what: str, error: type[OpgateError]) -> str:
    """Strict UTF-8, naming the line of the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        bad = data[exc.start : exc.start + 1].hex()
        raise problem(error, path, f"{what} is not UTF-8 text (byte 0x{bad})", line) from None


def read_text(path: Path, *, what: str, limit: int, error: type[OpgateError]) -> str:
    return decode(read_bytes(path, what=what, limit=limit, error=error), path, what=what, error=error)


def parse_json(text: str, path: Path | str, *, what: str, error: type[OpgateError]) -> Any:
    """``json.loads`` whose every failure is ``error`` with ``path:line``."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise problem(error, path, f"{what} is not valid JSON: {exc.msg}", exc.lineno) from None
    except RecursionError:
        raise problem(error, path, f"{what} is nested too deeply to read") from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise problem(error, path, f"{what} holds a value opgate cannot read: {exc}") from None


def read_json(
    path: Path,
    *,
    what: str,
    error: type[OpgateError] = ResultsFormatError,
    limit: int = MAX_JSON_BYTES,
    expect: type | None = None,
) -> Any:
    """Read and parse one JSON file; ``expect`` (dict or list) is the required top-level type."""
    data = parse_json(read_text(path, what=what, limit=limit, error=error), path, what=what, error=error)
    if expect is not None and not isinstance(data, expect):
        names: dict[type, str] = {dict: "a JSON object", list: "a JSON array"}
        wanted = names.get(expect, expect.__name__)
        raise problem(error, path, f"{what} must hold {wanted}, not {_json_type(data)}")
    return data


def _json_type(value: Any) -> str:
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if value is None:
        return "null"
    return f"a {type(value).__name__}"


def expect_type(value: Any, kind: type, where: str, what: str, error: type[OpgateError]) -> Any:
    """``value`` if it is a ``kind``, else ``error`` saying what ``what`` (at ``where``) should be."""
    if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
        return value
    names: dict[type, str] = {dict: "an object", list: "an array", str: "a string", int: "an integer"}
    wanted = names.get(kind, kind.__name__)
    raise error(f"{where}: {what} must be {wanted}, not {_json_type(value)}")


def write_output(path: Path, text: str, *, atomic: bool = False) -> None:
    """Write an output file (parents created); any failure is an :class:`OutputError` naming ``path``.

    Write errors (a full disk) carry no file name, so without this the one
    line would not say which output could not be written.  ``atomic``: write
    a sibling ``.tmp`` and rename it over ``path``, so a reader (or a run
    killed mid-write) never sees half a file.
    """
    target = path.with_name(path.name + ".tmp") if atomic else path
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        if atomic:
            target.replace(path)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None


@contextlib.contextmanager
def exclusive(lock: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on the file ``lock`` (made, with its folder, if missing).

    What read-modify-writes of a shared file (a cache's history, its variant
    store) and one-at-a-time decisions (a toolkit's install, a warm server's
    start) hold, so two processes never interleave them.  The lock is the open
    file's: a process killed while holding it releases it.
    """
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)
