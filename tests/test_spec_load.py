"""Op spec loading: discovery, the typed view, and file:line errors for bad specs."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from opgate.matrix.errors import ConfigError, ConfigErrors, UsageError
from opgate.matrix.spec import Evidence, Mutates, Tolerance, discover, load_spec, load_specs, resolve
from opgate.matrix.spec_schema import OPS_DIR

DATA = Path(__file__).parent / "data" / "config"
OPS = DATA / "ops"
TOY = OPS / "toy" / "spec.yaml"


@pytest.mark.integration
def test_repository_specs_load_without_torch() -> None:
    code = (
        "import sys; from opgate.matrix.spec import load_specs; s = load_specs(); "
        "assert 'rms_norm' in s, sorted(s); "
        "assert not any(m.split('.')[0] in ('torch', 'triton') for m in sys.modules), 'torch imported'"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=OPS_DIR, capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr


def test_rms_norm_exemplar() -> None:
    spec = load_specs()["rms_norm"]
    assert spec.root is None  # imported as opgate.ops.rms_norm: nothing goes onto sys.path
    assert spec.path == OPS_DIR / "rms_norm" / "spec.yaml"
    assert "default" in spec.shapes
    assert all(isinstance(s, tuple) for s in spec.shapes["default"])
    triton = spec.implementations["triton"]
    assert triton.kind == "triton"
    assert triton.qualname == "opgate::rms_norm"
    assert triton.evidence_for("cpu", "eager").expect == ("opgate::rms_norm",)


def test_toy_spec_typed_view() -> None:
    spec = load_spec(TOY, OPS)
    assert spec.op == "toy"
    assert spec.shapes == {"default": [(4, 8)], "big": [(1024, 1024)]}
    assert spec.cost == {"bytes": "2 * M * N * itemsize", "flops": "M * N"}
    assert spec.tolerance == Tolerance(k=2.0, atol_floor=1e-5)
    tri, cu, ext = (spec.implementations[n] for n in ("tri", "cu", "ext"))
    assert tri.dtypes == ["fp32", "fp16"]
    assert tri.modes == ["eager", "compile", "cudagraphs", "build"]
    assert cu.dtypes == ["fp32"]
    assert cu.modes == ["eager", "build"]
    assert cu.tolerance == Tolerance(k=4.0, atol_floor=1e-5)  # per field over the op's
    assert cu.copies_allowed == 1
    assert tri.copies_allowed == 0
    assert cu.sources == [OPS / "toy" / "toy.cu"]
    assert cu.arch_policy == {"sass": ["sm_80", "sm_90"], "ptx": False}
    assert ext.module == "toy_ref"  # external without module: the entry's module
    assert ext.requires == ["toy-dist"]
    assert ext.qualname is None


def test_evidence_for_modes_and_devices() -> None:
    tri = load_spec(TOY, OPS).implementations["tri"]
    assert tri.evidence_for("cpu", "eager") == Evidence(("toyns::toy",), ("aten::*",))
    assert tri.evidence_for("cpu", "compile") == Evidence(("toyns::toy",), ("aten::*",))
    assert tri.evidence_for("cuda", "eager") == Evidence(("_toy_kernel*",), ())
    assert tri.evidence_for("cuda", "compile") == Evidence(("_toy_kernel_compiled*",), ())
    cu = load_spec(TOY, OPS).implementations["cu"]
    assert cu.evidence_for("cpu", "eager") == Evidence()
    with pytest.raises(ValueError, match="device_kind"):
        tri.evidence_for("gpu", "eager")


def test_unsupported_reason() -> None:
    tri = load_spec(TOY, OPS).implementations["tri"]
    assert (
        tri.unsupported_reason("toy.tri-pt2.13-cpu-fp16-transposed-eager")
        == "fp16 needs a contiguous last dim"
    )
    assert tri.unsupported_reason("toy.tri-pt2.13-cpu-fp32-transposed-eager") is None


def test_resolve_imports_from_the_spec_root() -> None:
    spec = load_spec(TOY, OPS)
    fn = resolve(spec.reference, spec.root)
    assert fn(3.0) == 3.0
    assert resolve("os.path:join") is __import__("os").path.join
    with pytest.raises(ConfigError, match="no attribute"):
        resolve("os.path:nope")
    with pytest.raises(ConfigError, match="cannot import"):
        resolve("no_such_module_xyz:f")
    with pytest.raises(ConfigError, match="bad reference"):
        resolve("os.path.join")


def test_discovery_of_ops_path(tmp_path: Path) -> None:
    found = discover([OPS])
    extra = [(p.relative_to(OPS).as_posix(), root) for p, root in found if root == OPS]
    assert extra == [("toy/spec.yaml", OPS), ("flat.yaml", OPS)]  # notes.yaml: no spec_version
    assert (OPS_DIR / "rms_norm" / "spec.yaml", None) in found
    specs = load_specs([OPS])
    assert specs["flat"].root == OPS
    assert specs["flat"].implementations["ext"].kind == "external"
    with pytest.raises(UsageError, match="not a directory"):
        discover([tmp_path / "absent"])


def test_duplicate_op_names_name_both_files(tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        shutil.copy(OPS / "flat.yaml", tmp_path / name / "spec.yaml")
    with pytest.raises(ConfigError) as info:
        load_specs([tmp_path])
    (err,) = info.value.errors if isinstance(info.value, ConfigErrors) else [info.value]
    assert str(tmp_path / "a" / "spec.yaml") in err.problem
    assert str(tmp_path / "b" / "spec.yaml") in err.problem
    assert err.where is not None
    assert (err.where.path, err.where.line) == (str(tmp_path / "b" / "spec.yaml"), 3)


def spec_errors(tmp_path: Path, old: str, new: str, source: Path = TOY) -> list[ConfigError]:
    """Plant one fault into a copy of a good spec and return what loading reports."""
    text = source.read_text()
    assert old in text, old
    bad = tmp_path / "spec.yaml"
    bad.write_text(text.replace(old, new, 1))
    shutil.copy(OPS / "toy" / "toy.cu", tmp_path / "toy.cu")
    with pytest.raises(ConfigError) as info:
        load_spec(bad, OPS)  # the copy's references import from toy_ref.py, in OPS
    errs = info.value.errors if isinstance(info.value, ConfigErrors) else [info.value]
    for e in errs:
        assert e.where is not None
        assert e.where.path == str(bad)
    return errs


def line_with(tmp_path: Path, marker: str) -> int:
    lines = (tmp_path / "spec.yaml").read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if marker in text)


@pytest.mark.parametrize(
    ("old", "new", "marker", "problem", "hint"),
    [
        (
            "dtypes: [fp32, fp16]",
            "dtpyes: [fp32, fp16]",
            "dtpyes",
            "unknown key 'dtpyes'",
            "did you mean 'dtypes'?",
        ),
        ("category: other", "category: nrom", "nrom", "unknown category 'nrom'", "did you mean 'norm'?"),
        (
            "category: other",
            "module: other",
            "module: other",
            "key 'module' in op spec was renamed to 'category'",
            "write category:",
        ),
        ("kind: triton", "kind: trton", "trton", "unknown implementation kind", "did you mean 'triton'?"),
        (
            "dynamic_shapes: false",
            "dynamic_shapes: no",
            "dynamic_shapes",
            "YAML 1.1 boolean",
            "use true/false",
        ),
        ("k: 2.0", "k: -1", "k: -1", "expected a number > 0", None),
        ("  default: [[4, 8]]", "  small: [[4, 8]]", "shapes:", "'default' shape set is required", None),
        (
            "default: [[4, 8]]",
            "default: [[4, x]]",
            "[[4, x]]",
            "shapes.default[0][1]: expected an integer",
            None,
        ),
        (
            'flops: "M * N"',
            "flops: \"__import__('os')\"",
            "flops",
            "Call \"__import__('os')\" is not allowed",
            None,
        ),
        # ``^`` is Python's XOR: the schema and perf share one parser, so it is refused here, at load
        (
            'flops: "M * N"',
            'flops: "M ^ 2"',
            "flops",
            "cost.flops: cost 'M ^ 2': BitXor 'M ^ 2' is not allowed",
            None,
        ),
        (
            'flops: "M * N"',
            'flops: "M * Q"',
            "flops",
            "cost.flops: shape [4, 8]: cost 'M * Q': unknown symbol 'Q'",
            "cost.symbols",
        ),
        (
            'flops: "M * N"',
            'flops: "M * N"\n  symbols: [M, P, K]',
            "symbols",
            "cost.symbols: shape [4, 8]",
            None,
        ),
        (
            "    dtypes: [fp32]\n",
            "    dtypes: [bf16]\n",
            "dtypes: [bf16]",
            "bf16 not claimed by the op",
            None,
        ),
        ("sources: [toy.cu]", "sources: [missing.cu]", "missing.cu", "'missing.cu' not found", None),
        ("    qualname: toyns::toy\n", "", "  tri:", "kind triton needs qualname", "e.g. opgate::my_op"),
        (
            "entry: toy_ref:reference\n    qualname: toyns::toy\n",
            "entry: toy_ref.reference\n    qualname: toyns::toy\n",
            "toy_ref.reference",
            "not a module:attribute reference",
            None,
        ),
        (
            'cpu: {expect: ["aten::add"]}\n      cuda: {expect: ["*elementwise_kernel*"]}',
            'cpu: {forbid: ["aten::add"]}',
            "evidence:",
            "no expect pattern",
            None,
        ),
        (
            '\n      cuda: {expect: ["*elementwise_kernel*"]}',
            "",
            "evidence:",
            "no cuda expect pattern for mode(s) eager, compile, cudagraphs",
            "add evidence.cuda.expect",
        ),
        (
            'cuda: {expect: ["*elementwise_kernel*"]}',
            'cuda: {expect: [" *elementwise_kernel*"]}',
            "elementwise_kernel",
            "is not a glob over profiler event or kernel names",
            "no leading or trailing spaces",
        ),
        (
            'summary: "toy op for expansion tests"',
            "summary: no",
            "summary",
            "'no' is a YAML 1.1 boolean",
            None,
        ),
        ("op: toy", "op: Toy-Op", "Toy-Op", "is not an op name", None),
    ],
)
def test_spec_errors_have_file_line(
    tmp_path: Path, old: str, new: str, marker: str, *, problem: str, hint: str | None
) -> None:
    errs = spec_errors(tmp_path, old, new)
    hit = [e for e in errs if problem in e.problem]
    assert hit, [e.message() for e in errs]
    assert hit[0].where is not None
    if marker == "evidence:":  # the third implementation's evidence key
        lines = (tmp_path / "spec.yaml").read_text().splitlines()
        expected = [i for i, t in enumerate(lines, 1) if t.strip() == "evidence:"][-1]
    else:
        expected = line_with(tmp_path, marker)
    assert hit[0].where.line == expected
    if hint is not None:
        assert hit[0].hint is not None
        assert hint in hit[0].hint


def test_spec_reports_every_problem_at_once(tmp_path: Path) -> None:
    text = TOY.read_text().replace("category: other", "category: nrom").replace("kind: triton", "kind: trton")
    errs = spec_errors(
        tmp_path, "dtypes: [fp32, fp16]", "dtypes: [fp32, fp61]", source=_write(tmp_path, text)
    )
    assert len(errs) == 3
    assert [e.where.line for e in errs if e.where] == sorted(e.where.line for e in errs if e.where)


def _write(tmp_path: Path, text: str) -> Path:
    src = tmp_path / "source.yaml"
    src.write_text(text)
    return src


@pytest.mark.integration
def test_an_old_spec_with_module_stops_the_run_with_exit_3(tmp_path: Path) -> None:
    """``module:`` (the op group before it was renamed) is a one-line error naming file:line, exit 3."""
    folder = tmp_path / "ops" / "toy"
    shutil.copytree(OPS / "toy", folder)
    (tmp_path / "ops" / "toy_ref.py").write_text((OPS / "toy_ref.py").read_text())
    spec = folder / "spec.yaml"
    spec.write_text(spec.read_text().replace("category: other", "module: other"))
    line = next(i for i, t in enumerate(spec.read_text().splitlines(), 1) if t.startswith("module:"))
    proc = subprocess.run(
        [sys.executable, "-m", "opgate.matrix", "list", "--ops-path", str(tmp_path / "ops")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert f"{spec}:{line}" in proc.stderr
    assert "renamed to 'category'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_declared_mutation(tmp_path: Path) -> None:
    text = (OPS / "flat.yaml").read_text()
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(text + "    mutates: {inputs: [0], grad_outputs: [0, 1]}\n")
    ext = load_spec(spec_file, OPS).implementations["ext"]
    assert ext.mutates == Mutates(inputs=(0,), grad_outputs=(0, 1))
    assert load_spec(OPS / "flat.yaml", OPS).implementations["ext"].mutates == Mutates()
    errs = spec_errors(
        tmp_path,
        '      cuda: {expect: ["*elementwise_kernel*"]}\n',
        '      cuda: {expect: ["*elementwise_kernel*"]}\n    mutates: {input: [x]}\n',
        source=OPS / "flat.yaml",
    )
    assert any("unknown key 'input'" in e.problem for e in errs)
    assert any(e.hint and "did you mean 'inputs'?" in e.hint for e in errs)


def test_gpu_cells_declared_unsupported_need_no_cuda_evidence(tmp_path: Path) -> None:
    """A CPU-only implementation says so with ``unsupported``; then GPU evidence is not asked for."""
    text = TOY.read_text().replace('\n      cuda: {expect: ["*elementwise_kernel*"]}', "", 1)
    text = text.replace(
        "    requires: [toy-dist]\n",
        '    requires: [toy-dist]\n    unsupported:\n      - {match: "toy.ext-*-sm_*", reason: "CPU only"}\n',
    )
    (tmp_path / "spec.yaml").write_text(text)
    shutil.copy(OPS / "toy" / "toy.cu", tmp_path / "toy.cu")
    spec = load_spec(tmp_path / "spec.yaml", OPS)
    assert spec.implementations["ext"].evidence_for("cuda", "eager") == Evidence()


def test_evidence_patterns_may_hold_spaces_and_n_is_a_symbol(tmp_path: Path) -> None:
    """Demangled CUDA names have spaces; ``N`` (a YAML 1.1 boolean word) is a shape symbol in ``symbols``."""
    text = TOY.read_text().replace(
        'cuda: {expect: ["*elementwise_kernel*"]}',
        'cuda: {expect: ["kDequantizeBlockwise<float, 8, 0> | *gemv*"]}',
    )
    text = text.replace('flops: "M * N"', 'flops: "M * N"\n  symbols: [M, N]')
    (tmp_path / "spec.yaml").write_text(text)
    shutil.copy(OPS / "toy" / "toy.cu", tmp_path / "toy.cu")
    spec = load_spec(tmp_path / "spec.yaml", OPS)
    assert spec.cost["symbols"] == ["M", "N"]
    rule = spec.implementations["ext"].evidence_for("cuda", "eager")
    assert rule.expect == ("kDequantizeBlockwise<float, 8, 0> | *gemv*",)
    from opgate.validators.profiling import matches

    assert matches("kDequantizeBlockwise<float, 8, 0>", rule.expect[0])
    assert matches("cutlass_gemv_kernel", rule.expect[0])
    assert not matches("kDequantizeBlockwise<float, 4, 0>", rule.expect[0])


def test_declared_libraries(tmp_path: Path) -> None:
    """``libraries``: what a module builds at import, resolved next to the spec; mistakes at file:line."""
    good = "    qualname: toyns::toy\n    libraries: [{name: toy_launch, sources: [toy.cu]}]\n"
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(TOY.read_text().replace("    qualname: toyns::toy\n", good, 1))
    shutil.copy(OPS / "toy" / "toy.cu", tmp_path / "toy.cu")
    tri = load_spec(spec_file, OPS).implementations["tri"]
    assert [(lib.name, lib.sources) for lib in tri.libraries] == [("toy_launch", (tmp_path / "toy.cu",))]
    assert load_spec(TOY, OPS).implementations["tri"].libraries == ()

    missing = spec_errors(tmp_path, "    qualname: toyns::toy\n", good.replace("[toy.cu]", "[gone.cpp]"))
    assert [e.problem for e in missing] == [
        "implementations.tri.libraries.toy_launch: 'gone.cpp' not found next to the spec"
    ]
    assert missing[0].where is not None
    assert missing[0].where.line == line_with(tmp_path, "libraries:")
    twice = "    libraries: [{name: a, sources: [toy.cu]}, {name: a, sources: [toy.cu]}]\n"
    errs = spec_errors(tmp_path, "    qualname: toyns::toy\n", "    qualname: toyns::toy\n" + twice)
    assert any("'a' twice" in e.problem for e in errs)
    external = "    requires: [toy-dist]\n    libraries: [{name: a, sources: [toy.cu]}]\n"
    errs = spec_errors(tmp_path, "    requires: [toy-dist]\n", external)
    assert any("kind external builds nothing with opgate" in e.problem for e in errs)
    errs = spec_errors(
        tmp_path, "    qualname: toyns::toy\n", "    qualname: toyns::toy\n    libraries: [{name: a}]\n"
    )
    assert any("sources" in e.problem for e in errs), [e.problem for e in errs]
