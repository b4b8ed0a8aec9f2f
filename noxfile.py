"""opgate's sessions: the project's tests, lint, and the compatibility matrix per torch version.

Session names are part of CI's contract (workflows call them by name), so they
never depend on the machine:

    tests                     the test suite, parallel (torch 2.13.0 + triton 3.8.0), coverage on request
    lint                      ruff, ruff format, mypy, import-linter, actionlint, zizmor (LINT_COMMANDS)
    wheel                     build the wheel, install it as a team would, validate a new op with it
    matrix(torch=2.13.0)      the default matrix in a venv with that torch (and its triton)
    matrix(torch=2.14.1)      same, CUDA 13 build of torch (runs on CPU where there is no GPU)
    matrix(torch=installed)   the Python that started nox, as it is (GPU boxes, no network)
    liger                     the liger-kernel op specs (``-- --ops-path DIR`` to point elsewhere)
    bitsandbytes              the bitsandbytes op specs (CPU path + arch audit of its CUDA .so files)

What *does* depend on the machine is which of them ``nox -s matrix`` means:
the pinned torch versions on a machine that can install them, ``installed`` on
a GPU machine whose Python already carries a CUDA torch (and usually has no
network).  ``OPGATE_MATRIX_DEFAULT=pinned|installed`` overrides the guess.
Every matrix session writes ``out/runs/<torch id>`` and then republishes
``out/report`` from every run present (``OPGATE_OUT`` moves ``out``), so
running two versions one after the other leaves one merged table with a
column per torch.

pip is the installer on purpose: the local wheel index that carries torch's
CPU and CUDA builds is reached by pip's configuration only.

``python3 noxfile.py ARGS`` is ``nox ARGS`` on a machine with nothing but
Python: when the interpreter lacks nox, nox is installed into
``.nox/_bootstrap`` once.  Either way ``OPGATE_PYTHON`` keeps the interpreter
the user started, which is what ``matrix(torch=installed)`` validates.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

NOX_REQUIREMENT = "nox>=2024.10.9"
BOOTSTRAP = Path(__file__).resolve().parent / ".nox" / "_bootstrap"


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".")[:3] if part.isdigit())


def _has_nox() -> bool:
    try:
        return _version_tuple(importlib.metadata.version("nox")) >= (2024, 10, 9)
    except importlib.metadata.PackageNotFoundError:
        return False


def bootstrap_main(argv: list[str]) -> int:
    """``python3 noxfile.py ARGS``: run nox (installing it into .nox/_bootstrap if need be)."""
    python = sys.executable
    if not _has_nox():
        bindir = BOOTSTRAP / ("Scripts" if os.name == "nt" else "bin")
        python = str(bindir / ("python.exe" if os.name == "nt" else "python"))
        if not Path(python).exists():
            subprocess.run([sys.executable, "-m", "venv", str(BOOTSTRAP)], check=True)
        if not any(bindir.glob("nox*")):  # also finishes a bootstrap that was interrupted
            print(f"noxfile.py: installing {NOX_REQUIREMENT} into {BOOTSTRAP}", file=sys.stderr)
            subprocess.run([python, "-m", "pip", "install", "--quiet", NOX_REQUIREMENT], check=True)
    env = {**os.environ, "OPGATE_PYTHON": os.environ.get("OPGATE_PYTHON", sys.executable)}
    return subprocess.call([python, "-m", "nox", "-f", __file__, *argv], env=env)


if __name__ == "__main__":
    sys.exit(bootstrap_main(sys.argv[1:]))

import nox  # noqa: E402 - after the bootstrap, which must run without nox

nox.needs_version = ">=2024.10.9"
nox.options.default_venv_backend = "virtualenv"
nox.options.envdir = ".nox"
nox.options.error_on_missing_interpreters = True

ROOT = Path(__file__).resolve().parent
PYPROJECT = nox.project.load_toml(ROOT / "pyproject.toml")
PROJECT_DEPS: list[str] = list(PYPROJECT["project"]["dependencies"])
EXTRAS: dict[str, list[str]] = PYPROJECT["project"]["optional-dependencies"]

#: torch version -> the triton it is validated with (torch 2.14.1 itself asks triton~=3.8.0).
TORCH_PINS: dict[str, str] = {"2.13.0": "3.8.0", "2.14.1": "3.8.0"}
#: The torch of the test suite and of the lint venv (mypy needs torch's types).
TEST_TORCH = "2.13.0"
#: Installed beside every torch (see install_torch_env).
TORCH_ENV_EXTRAS = ("numpy",)
INSTALLED = "installed"

#: ``OPGATE_OUT`` moves every output (tests point it at a temporary folder).
OUT = Path(os.environ.get("OPGATE_OUT", "out"))
RUNS = OUT / "runs"
REPORT = OUT / "report"
#: With ``--install-only`` nox skips every ``session.run``: there is nothing to publish.
INSTALL_ONLY = "--install-only" in sys.argv
#: The interpreter ``matrix(torch=installed)`` validates: the one the user started.
INSTALLED_PYTHON = os.environ.get("OPGATE_PYTHON") or sys.executable
#: What ``nox -s lint`` runs, in order.  .pre-commit-config.yaml runs the same commands as local
#: hooks (tests/test_precommit_config.py holds the two together); mypy also gets ``MYPYPATH``.
LINT_COMMANDS: tuple[tuple[str, ...], ...] = (
    ("ruff", "check", "."),
    ("ruff", "format", "--check", "."),
    ("mypy",),
    # import-linter: matrix -> validators -> reports, ops imports no stage ([tool.importlinter])
    ("lint-imports",),
    # .github/actionlint.yaml declares the self-hosted GPU runner labels
    ("actionlint", "-config-file", ".github/actionlint.yaml"),
    # workflows and dependabot.yml; deliberate findings are explained in .github/zizmor.yml
    ("zizmor", "--offline", "--persona=pedantic", "--config", ".github/zizmor.yml", ".github"),
)
#: How ``nox -s tests`` runs pytest: every core (xdist), a test file per worker at a time.
#: ``--no-loadscope-reorder``: files go out in collection order, the longest first (tests/conftest.py).
PYTEST_PARALLEL: tuple[str, ...] = (
    "-n", os.environ.get("OPGATE_TEST_WORKERS", "auto"), "--dist", "loadfile", "--no-loadscope-reorder",
)  # fmt: skip
#: Coverage of the stages and ops measured in the test processes ([tool.coverage] in pyproject.toml),
#: with ``OPGATE_TEST_COVERAGE=1``.  Not by default: Python 3.11's trace function sees every call of
#: the in-process torch.compile and export cells, and the suite took 575 s with it against 413 s
#: without (2 cores), where the tests session must stay well under CI's 10 minutes.
PYTEST_COVERAGE: tuple[str, ...] = ("--cov", "--cov-report=term:skip-covered")
#: The slowest tests, listed at the end of every run: what to look at first when CI gets slow.
PYTEST_DURATIONS: tuple[str, ...] = ("--durations=30",)
#: What a session needs beyond Python packages, on a bare Debian/Ubuntu machine: command -> package.
#: chromium: the HTML report's browser test; shellcheck: actionlint checks workflows' run: scripts.
SYSTEM_PACKAGES: dict[str, dict[str, str]] = {
    "tests": {"chromium": "chromium", "shellcheck": "shellcheck"},
    "lint": {"shellcheck": "shellcheck"},
}
#: Where the liger-kernel specs live unless the session is given ``--ops-path``.
LIGER_SPECS = Path("ops/external/liger")
#: liger specs name their ops ``liger_*`` (e.g. ``liger_rms_norm``).
LIGER_SELECT = "liger_*"
#: The bitsandbytes specs (a prebuilt CUDA C++ library from PyPI), ops named ``bnb_*``.
BNB_SPECS = Path("ops/external/bitsandbytes")
BNB_SELECT = "bnb_*"


def torch_version(python: str) -> str | None:
    """The torch distribution version of ``python`` (metadata only, torch is not imported)."""
    # Not resolve(): a venv's python is a symlink to the base interpreter, with other packages.
    if os.path.abspath(python) == os.path.abspath(sys.executable):  # noqa: PTH100
        try:
            return importlib.metadata.version("torch")
        except importlib.metadata.PackageNotFoundError:
            return None
    probe = (
        "import importlib.metadata as m\ntry: print(m.version('torch'))\nexcept m.PackageNotFoundError: pass"
    )
    done = subprocess.run([python, "-c", probe], capture_output=True, text=True, check=False, timeout=60)
    return done.stdout.strip() or None


def matrix_default() -> str:
    """``"installed"`` on a GPU machine whose Python has torch, ``"pinned"`` elsewhere.

    The GPU machine's torch (a CUDA build, no network to fetch another) is the
    environment worth validating there; a CPU machine validates the pins.
    """
    override = os.environ.get("OPGATE_MATRIX_DEFAULT", "").strip().lower()
    if override in ("pinned", INSTALLED):
        return override
    if override:
        raise SystemExit(f"OPGATE_MATRIX_DEFAULT={override!r}: expected 'pinned' or 'installed'")
    has_gpu = Path("/dev/nvidia0").exists() or shutil.which("nvidia-smi") is not None
    return INSTALLED if has_gpu and torch_version(INSTALLED_PYTHON) else "pinned"


def checkout_path() -> Path:
    """A folder to put on ``PYTHONPATH`` (or ``MYPYPATH``) so ``opgate`` imports from this checkout.

    ``opgate`` is a namespace package whose stages are the checkout's folders, so a
    link ``opgate -> checkout`` is all an interpreter needs; no build backend, no
    network.  mypy, which cannot follow an editable install's import hook, reads
    the same tree.
    """
    shim = ROOT / ".nox" / "_checkout"
    link = shim / "opgate"
    shim.mkdir(parents=True, exist_ok=True)
    if not (link.is_symlink() and link.resolve() == ROOT):
        link.unlink(missing_ok=True)
        link.symlink_to(ROOT, target_is_directory=True)
    return shim


def apt_commands(packages: list[str]) -> list[list[str]] | None:
    """The apt-get commands that install ``packages`` here: as root, or through passwordless sudo.

    None when neither is possible (or there is no apt-get): the caller says what to install.
    """
    if not packages or shutil.which("apt-get") is None:
        return None
    prefix: list[str] = []
    if os.geteuid() != 0:
        sudo = shutil.which("sudo")
        if sudo is None or subprocess.run([sudo, "-n", "true"], capture_output=True, check=False).returncode:
            return None
        prefix = [sudo, "-n"]
    install = ["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y", "-qq"]
    return [[*prefix, "apt-get", "update", "-qq"], [*prefix, *install, "--no-install-recommends", *packages]]


def provision(session: nox.Session) -> None:
    """Install the Debian packages this session's tools need (``SYSTEM_PACKAGES``) when they are missing.

    The README's commands are all a newcomer runs, on a bare machine too; where
    nothing can be installed (no root, no sudo, no apt-get) the session says
    what is missing and goes on, and the tests that need it fail saying so:
    nothing is skipped silently.
    """
    needed = SYSTEM_PACKAGES.get(session.name, {})
    missing = sorted({pkg for command, pkg in needed.items() if shutil.which(command) is None})
    if not missing:
        return
    commands = apt_commands(missing)
    if commands is None:
        session.warn(
            f"missing {', '.join(missing)} and no way to install it here (needs root or sudo, and apt-get): "
            f"install {' '.join(missing)}; the tests that need it fail until then"
        )
        return
    for command in commands:
        session.run(*command, external=True)


def install_torch_env(session: nox.Session, torch: str) -> None:
    """The project's runtime deps with one pinned torch and the triton that goes with it.

    numpy: triton's CPU interpreter (TRITON_INTERPRET=1) imports it without declaring it.
    """
    session.install(*PROJECT_DEPS, f"torch=={torch}", f"triton=={TORCH_PINS[torch]}", *TORCH_ENV_EXTRAS)
    # opgate itself, editable: the checkout's folders are ``opgate.<stage>`` in the venv.
    session.install("--no-deps", "-e", str(ROOT))


def publish_all_runs(session: nox.Session, python: str) -> None:
    """Merge every torch run under out/runs into one table (a column per environment)."""
    runs = sorted(p.parent for p in RUNS.glob("*/results.json"))
    if not runs:
        if INSTALL_ONLY:
            return
        session.error(f"no results.json under {RUNS}/*: nothing to publish")
    ins = [arg for run in runs for arg in ("--in", str(run))]
    strict = ["--strict"] if os.environ.get("OPGATE_STRICT") == "1" else []  # an incomplete run: refuse
    session.run(python, "-m", "opgate.reports", "publish", *ins, "--out", str(REPORT), *strict)


def run_matrix(session: nox.Session, torch_id: str, python: str) -> None:
    """Run the default matrix into out/runs/<torch_id>, then republish out/report.

    posargs go to ``validators run`` (``--select``, ``--skip``, ``--jobs``, ...).
    """
    out = RUNS / torch_id
    # Exit 1 means "every cell recorded, some are red": findings, not a broken job. The table is
    # published either way; OPGATE_STRICT=1 turns red cells into a failed session (a local gate).
    session.run(
        python, "-m", "opgate.validators", "run", "--out", str(out), *session.posargs, success_codes=[0, 1]
    )
    publish_all_runs(session, python)
    red = red_cells(out / "results.json")
    if red:
        session.log(f"{len(red)} red cell(s) in {out}: see {REPORT / 'compat.md'}")
        if os.environ.get("OPGATE_STRICT") == "1":
            session.error(f"OPGATE_STRICT=1 and {len(red)} cell(s) are fail/fallback/error/flaky")


def red_cells(results: Path) -> list[str]:
    """Ids of the cells a gate would reject: ``Verdict.is_bad``, the one rule every report uses.

    ``opgate.validators.result`` needs nothing beyond the standard library, so nox's
    own interpreter imports it from the checkout: ``opgate`` is a namespace whose
    stages are the checkout's folders (installed, they are ``site-packages/opgate/*``).
    """
    if not results.exists():
        return []
    if "opgate" not in sys.modules:
        namespace = types.ModuleType("opgate")
        namespace.__path__ = [str(ROOT)]
        sys.modules["opgate"] = namespace
    from opgate.validators.result import Verdict

    cells = json.loads(results.read_text()).get("cells", [])
    return [c["id"] for c in cells if Verdict(c.get("verdict")).is_bad]


def matrix_pinned(session: nox.Session, torch: str) -> None:
    install_torch_env(session, torch)
    run_matrix(session, torch, "python")


def matrix_installed(session: nox.Session) -> None:
    """No venv: the interpreter the user started (``OPGATE_PYTHON``), with whatever it has."""
    version = torch_version(INSTALLED_PYTHON)
    if version is None:
        session.error(f"{INSTALLED_PYTHON} has no torch installed; use matrix(torch={TEST_TORCH})")
    session.log(f"validating torch {version} of {INSTALLED_PYTHON}")
    session.env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(checkout_path()), os.environ.get("PYTHONPATH")) if p
    )
    run_matrix(session, INSTALLED, INSTALLED_PYTHON)


def _register_matrix_sessions() -> None:
    """Register the three matrix sessions; only this machine's default answers to ``-s matrix``.

    nox runs every session whose *name* is ``matrix`` for ``-s matrix``.  The
    default ones are registered as the parametrized session ``matrix`` (names
    ``matrix(torch=X)``); the others under their full name alone, so the names
    are the same everywhere and only the grouping moves.
    """
    pinned_ids = [f"torch={v}" for v in TORCH_PINS]
    if matrix_default() == INSTALLED:

        @nox.session(name="matrix", python=False, default=False)
        @nox.parametrize("torch", [INSTALLED], ids=[f"torch={INSTALLED}"])
        def matrix_default_installed(session: nox.Session, torch: str) -> None:
            """The default matrix with the torch of the interpreter that started nox (machine default)."""
            matrix_installed(session)

        for version, session_id in zip(TORCH_PINS, pinned_ids, strict=True):
            _register_pinned(version, f"matrix({session_id})")
        return

    @nox.session(name="matrix", reuse_venv=True, default=False)
    @nox.parametrize("torch", list(TORCH_PINS), ids=pinned_ids)
    def matrix_default_pinned(session: nox.Session, torch: str) -> None:
        """The default matrix in a venv per pinned torch (machine default)."""
        matrix_pinned(session, torch)

    @nox.session(name=f"matrix(torch={INSTALLED})", python=False, default=False)
    def matrix_with_installed(session: nox.Session) -> None:
        """The default matrix with the torch of the interpreter that started nox (no venv)."""
        matrix_installed(session)


def _register_pinned(version: str, name: str) -> None:
    @nox.session(name=name, reuse_venv=True, default=False)
    def pinned(session: nox.Session) -> None:
        """The default matrix in a venv with a pinned torch."""
        matrix_pinned(session, version)


_register_matrix_sessions()


@nox.session(reuse_venv=True)
def tests(session: nox.Session) -> None:
    """The project's test suite, unit and integration tests, in parallel.

    ``OPGATE_TEST_WORKERS`` xdist workers (default ``auto``: one per core), each test file
    on one worker (``loadfile``: a module's fixtures are built once), the longest files first
    (``tests/conftest.py``).  ``-- -m unit`` runs the fast tier only (tests/tiers.py);
    ``OPGATE_TEST_COVERAGE=1`` adds the coverage report (:data:`PYTEST_COVERAGE`).  pytest's
    exit 5 (nothing collected) fails the session.
    """
    provision(session)
    install_torch_env(session, TEST_TORCH)
    session.install(*EXTRAS["test"])
    coverage = PYTEST_COVERAGE if os.environ.get("OPGATE_TEST_COVERAGE", "0").strip() == "1" else ()
    pytest = ("python", "-m", "pytest", *PYTEST_PARALLEL, *coverage, *PYTEST_DURATIONS)
    session.run(*pytest, *session.posargs)


@nox.session(reuse_venv=True)
def lint(session: nox.Session) -> None:
    """ruff, formatting, mypy (against torch's own types), the import layers, actionlint and zizmor."""
    provision(session)
    install_torch_env(session, TEST_TORCH)
    # the test extras too: mypy checks the tests against the libraries they use (pytest, ...)
    session.install(*EXTRAS["lint"], *EXTRAS["test"])
    # mypy and import-linter read opgate from the checkout link (see checkout_path)
    paths = {"mypy": "MYPYPATH", "lint-imports": "PYTHONPATH"}
    for command in LINT_COMMANDS:
        var = paths.get(command[0])
        session.run(*command, env={var: str(checkout_path())} if var else None)


def _external(session: nox.Session, distribution: str, specs: Path, select: str, run: str) -> None:
    """One third-party library's ops validated from its specs alone (no opgate code in between)."""
    install_torch_env(session, TEST_TORCH)
    session.install(distribution)
    args = list(session.posargs)
    if "--ops-path" not in args:
        if not specs.is_dir():
            session.error(f"no {distribution} specs at {specs}/: pass `-- --ops-path DIR`")
        args += ["--ops-path", str(specs)]
    if "--select" not in args:
        # --ops-path adds specs beside the first-party ones: keep the run to the library's.
        args += ["--select", select]
    session.run("python", "-m", "opgate.validators", "run", "--out", str(RUNS / run), *args)


@nox.session(reuse_venv=True, default=False)
def wheel(session: nox.Session) -> None:
    """The wheel as a team installs it (tests/test_wheel.py, also part of ``tests``).

    Built from the checkout, installed into a fresh venv beside PyPI's
    ``validators``; ``opgate init`` scaffolds an op in a repository whose package
    is ``ops``, and the installed ``opgate run`` validates it.  Only pytest is
    needed here: the test makes its own venv.
    """
    session.install("pytest>=8", "pyyaml>=6.0")
    # the suite's conftest imports opgate from the checkout (the test itself runs the installed wheel)
    env = {"PYTHONPATH": str(checkout_path())}
    session.run(
        "python", "-m", "pytest", "-p", "no:cacheprovider", "tests/test_wheel.py", *session.posargs, env=env
    )


@nox.session(reuse_venv=True, default=False)
def liger(session: nox.Session) -> None:
    """liger-kernel's ops validated from specs alone (no opgate code in between)."""
    _external(session, "liger-kernel", LIGER_SPECS, LIGER_SELECT, "liger")


@nox.session(reuse_venv=True, default=False)
def bitsandbytes(session: nox.Session) -> None:
    """bitsandbytes' NF4 ops from specs alone: its CPU path, and the arch audit of its CUDA .so files."""
    _external(session, "bitsandbytes", BNB_SPECS, BNB_SELECT, "bitsandbytes")
    publish_all_runs(session, "python")
