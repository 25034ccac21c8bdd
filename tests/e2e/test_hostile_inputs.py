"""Hostile model files and output paths: one clear line, exit code 2, no output left, nothing read
outside the model's folder.

tests/cli/test_cli.py already covers a missing file, an empty file, non-protobuf bytes, a truncated model,
an undefined tensor, bad options, a missing output folder and output == input; this file adds the rest.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from amp_compiler import convert
from amp_compiler.cli import main
from amp_compiler.errors import ModelLoadError
from amp_compiler.onnx.load import skeleton
from amp_compiler.onnx.load.files import PROTOBUF_LIMIT, load_model
from amp_compiler.onnx.measure.checks import validate
from tests.support.onnx_builders import F32, tensor, vi, weights

# ------------------------------------------------------------------------------------------ helpers


@pytest.fixture(autouse=True, params=["whole", "described"])
def weights_described(request, monkeypatch):
    """Every case runs twice: with each model given whole to onnx's checker and shape inference, and
    with every float weight described by type and shape only (amp_compiler.onnx.load.skeleton, which
    large models take): the verdicts must not change."""
    if request.param == "described":
        monkeypatch.setattr(skeleton, "MIN_SAVED_BYTES", 0)
        monkeypatch.setattr(skeleton, "MIN_ELEMENTS", 1)


def make(nodes, inputs, outputs, inits=(), opset=18, ir_version=9, domains=(), name="g") -> onnx.ModelProto:
    """A model built without onnx's checker (these models are meant to be wrong)."""
    g = helper.make_graph(list(nodes), name, list(inputs), list(outputs), list(inits))
    imports = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in domains]
    m = helper.make_model(g, opset_imports=imports)
    m.ir_version = ir_version
    return m


def good_model() -> onnx.ModelProto:
    """x -> Relu -> MatMul -> Relu -> y: a K = 4 product straight of the input would stay FP32
    (policy.high.raw-small-product); of an activation it is low."""
    return make(
        [helper.make_node("Relu", ["x"], ["h"], name="act"), helper.make_node("MatMul", ["h", "w"], ["a"], name="mm"),
         helper.make_node("Relu", ["a"], ["y"], name="relu")],
        [vi("x", F32, [2, 4])], [vi("y", F32, [2, 4])], [tensor("w", weights((4, 4)))],
    )


def cli(argv) -> tuple[int, str, str]:
    """Run the CLI in-process; returns (exit code, stdout, stderr)."""
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def refused(path: Path, *needles: str, out: Path | None = None) -> str:
    """Convert ``path``; assert one error line with each needle, exit 2, and no output file."""
    out = out or path.with_name("out.onnx")
    existed = out.exists()
    code, stdout, err = cli(["convert", path, "-o", out])
    lines = err.strip().splitlines()
    assert code == 2, (code, err)
    assert len(lines) == 1, err
    assert lines[0].startswith("amp-compiler: error: "), err
    assert "Traceback" not in err and stdout == ""
    for n in needles:
        assert n in lines[0], (n, lines[0])
    if not existed:
        assert not out.exists()
    if out.parent.is_dir():
        assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")], "temporary file left"
    return lines[0]


def write(tmp_path: Path, m: onnx.ModelProto | bytes, name="m.onnx") -> Path:
    p = tmp_path / name
    p.write_bytes(m if isinstance(m, bytes) else m.SerializeToString())
    return p


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


# -------------------------------------------------------------------------------- not a model at all


@pytest.mark.parametrize("seed", range(5))
def test_random_bytes(tmp_path, seed):
    data = np.random.default_rng(seed).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    refused(write(tmp_path, data), "not an ONNX model")


@pytest.mark.parametrize(
    "message, needle",
    [
        (numpy_helper.from_array(np.zeros((4, 4), np.float32), "w"), "not an ONNX model"),
        (good_model().graph, "holds no ONNX graph"),
        (helper.make_tensor_value_info("x", F32, [2]), "holds no ONNX graph"),
        (onnx.ModelProto(ir_version=9), "holds no ONNX graph"),
    ],
    ids=["TensorProto", "GraphProto", "ValueInfoProto", "ModelProto-without-graph"],
)
def test_valid_protobuf_that_is_not_a_model(tmp_path, message, needle):
    refused(write(tmp_path, message.SerializeToString()), needle)


def test_model_without_opset_import(tmp_path):
    m = good_model()
    del m.opset_import[:]
    refused(write(tmp_path, m), "imports no opset")


def test_input_that_is_not_a_regular_file(tmp_path):
    refused(tmp_path, "is a directory", out=tmp_path / "o.onnx")
    fifo = tmp_path / "pipe.onnx"
    os.mkfifo(fifo)  # reading it would block forever
    refused(fifo, "not a regular file")


@settings(max_examples=150, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_model_bytes_never_crash(data):
    """Truncations, byte flips and splices of a valid model: the loader accepts or refuses cleanly."""
    base = good_model().SerializeToString()
    kind = data.draw(st.sampled_from(["truncate", "flip", "splice"]))
    if kind == "truncate":
        cut = data.draw(st.integers(1, len(base) - 1))
        blob = base[:cut]
    elif kind == "flip":
        blob = bytearray(base)
        for _ in range(data.draw(st.integers(1, 4))):
            i = data.draw(st.integers(0, len(blob) - 1))
            blob[i] = data.draw(st.integers(0, 255))
        blob = bytes(blob)
    else:
        i = data.draw(st.integers(0, len(base)))
        blob = base[:i] + data.draw(st.binary(min_size=1, max_size=32)) + base[i:]
    model = onnx.ModelProto()
    try:
        model.ParseFromString(blob)
    except Exception:
        model = None
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "m.onnx"
        p.write_bytes(blob)
        try:
            loaded = load_model(p)
        except ModelLoadError as exc:
            assert "\n" not in str(exc)
            return
    assert model is not None
    try:  # it loaded: it must convert, or refuse with a user error
        convert(loaded, probe=False)
    except ModelLoadError:
        pass


# ------------------------------------------------------------------------------------- invalid graphs


X, Y = vi("x", F32, [2, 2]), vi("y", F32, [2, 2])


def test_graph_with_a_cycle(tmp_path):
    m = make(
        [
            helper.make_node("Add", ["x", "b"], ["a"], name="add"),
            helper.make_node("Relu", ["a"], ["b"], name="relu"),
            helper.make_node("Identity", ["a"], ["y"], name="id"),
        ],
        [X], [Y],
    )
    line = refused(write(tmp_path, m), "cycle")
    assert "'add'" in line and "'relu'" in line


def test_node_reading_its_own_output(tmp_path):
    m = make([helper.make_node("Add", ["x", "y"], ["y"], name="self")], [X], [Y])
    refused(write(tmp_path, m), "cycle", "'self'")


def test_cycle_inside_a_subgraph(tmp_path):
    body = helper.make_graph(
        [helper.make_node("Add", ["x", "q"], ["p"]), helper.make_node("Neg", ["p"], ["q"])], "then", [],
        [vi("p", F32, [2, 2])],
    )
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["r"])], "else", [], [vi("r", F32, [2, 2])])
    m = make(
        [helper.make_node("If", ["c"], ["y"], then_branch=body, else_branch=other)],
        [X, vi("c", TensorProto.BOOL, [])], [Y],
    )
    refused(write(tmp_path, m), "cycle", "subgraph 'then'")


def test_nodes_out_of_topological_order_are_sorted_not_refused(tmp_path):
    """onnxruntime loads such a graph (it sorts it), and its own float16 converter writes them: sorting
    changes nothing the nodes compute, so the conversion sorts and says so (a cycle is still refused)."""
    m = make([helper.make_node("Relu", ["a"], ["y"]), helper.make_node("Neg", ["x"], ["a"])], [X], [Y])
    out = tmp_path / "out.onnx"
    code, stdout, err = cli(["convert", write(tmp_path, m), "-o", out])
    assert code == 0, err
    assert "nodes sorted into topological order in its graph" in stdout
    written = onnx.load(out)
    onnx.checker.check_model(written, full_check=True)
    assert [n.op_type for n in written.graph.node if n.op_type != "Cast"] == ["Neg", "Relu"]


def test_undefined_tensor_names_node_and_tensor(tmp_path):
    m = make([helper.make_node("Add", ["x", "ghost"], ["y"], name="adder")], [X], [Y])
    refused(write(tmp_path, m), "'adder'", "'ghost'", "no node, graph input or initializer defines")


def test_undefined_graph_output(tmp_path):
    m = make([helper.make_node("Relu", ["x"], ["y"])], [X], [Y, vi("nothing", F32, [2, 2])])
    refused(write(tmp_path, m), "'nothing'", "not produced")


def test_duplicate_node_output_names(tmp_path):
    m = make([helper.make_node("Relu", ["x"], ["y"], name="r"), helper.make_node("Neg", ["x"], ["y"], name="n")], [X], [Y])
    refused(write(tmp_path, m), "'y' is produced twice", "'r'", "'n'")


def test_node_output_shadowing_a_graph_input(tmp_path):
    m = make([helper.make_node("Relu", ["x"], ["x"], name="r"), helper.make_node("Neg", ["x"], ["y"])], [X], [Y])
    refused(write(tmp_path, m), "'x' is produced twice")


def test_duplicate_graph_output_names(tmp_path):
    m = make([helper.make_node("Relu", ["x"], ["y"])], [X], [Y, Y])
    # valid for onnx's checker and onnxruntime (hummingbird's SVC export): not called invalid, and how to go on
    line = refused(write(tmp_path, m), "graph output 'y' is listed twice", "del model.graph.output[1]")
    assert "invalid" not in line


def test_duplicate_graph_input_names(tmp_path):
    m = make([helper.make_node("Relu", ["x"], ["y"])], [X, X], [Y])
    refused(write(tmp_path, m), "'x'")


@pytest.mark.parametrize("domain", ["", "ai.onnx.ml"])
def test_opset_the_installed_onnx_does_not_know(tmp_path, domain):
    m = make([helper.make_node("Relu", ["x"], ["y"])], [X], [Y])
    if domain:
        m.opset_import.append(helper.make_opsetid(domain, 999))
    else:
        m.opset_import[0].version = 999
    refused(write(tmp_path, m), "opset 999", "does not know", onnx.__version__)


def test_ir_version_the_installed_onnx_does_not_know(tmp_path):
    m = make([helper.make_node("Relu", ["x"], ["y"])], [X], [Y], ir_version=onnx.IR_VERSION + 50)
    refused(write(tmp_path, m), f"IR version {onnx.IR_VERSION + 50}")


def test_unknown_op_of_the_default_domain(tmp_path):
    m = make([helper.make_node("Frobnicate", ["x"], ["y"])], [X], [Y])
    refused(write(tmp_path, m), "Frobnicate")


def test_custom_domain_op_without_schema_converts_and_stays_fp32(tmp_path):
    m = make(
        [
            helper.make_node("MatMul", ["x", "w"], ["a"], name="mm"),
            helper.make_node("Frobnicate", ["a"], ["b"], domain="com.example", name="custom"),
            helper.make_node("MatMul", ["b", "w"], ["y"], name="mm2"),
        ],
        [vi("x", F32, [2, 16])], [vi("y", F32, [2, 16])], [tensor("w", weights((16, 16)))], domains=["com.example"],
    )
    p = write(tmp_path, m)
    out = tmp_path / "out.onnx"
    code, stdout, err = cli(["convert", p, "-o", out])
    assert code == 0, err
    converted = onnx.load(out)
    validate(converted)
    node = next(n for n in converted.graph.node if n.op_type == "Frobnicate")
    assert node.domain == "com.example"
    result = convert(m, probe=False)
    decision = next(d for d in result.decisions if d.op_type == "Frobnicate")
    assert decision.rule == "policy.unknown-op" and decision.input_dtypes == ["fp32"]
    # it reads an FP32 tensor: a Cast back from the FP16 MatMul before it
    producers = {o: n for n in result.model.graph.node for o in n.output}
    feed = producers[node.input[0]]
    assert feed.op_type == "Cast" and feed.attribute[0].i == TensorProto.FLOAT


def _flip_name(blob: bytes, name: bytes) -> bytes:
    i = blob.index(name)
    return blob[:i] + b"\xff" + blob[i + 1:]


def test_name_that_is_not_utf8(tmp_path):
    """proto2 strings are not validated by protobuf's parser; Python then hands back bytes."""
    blob = _flip_name(good_model().SerializeToString(), b"relu")
    refused(write(tmp_path, blob), "node[2].name", "not valid UTF-8")


@pytest.mark.parametrize(
    "change, needle",
    [
        (lambda w: w.dims.__setitem__(0, 1), "holds 64 bytes but its shape [1, 4] needs 16"),
        (lambda w: setattr(w, "data_type", TensorProto.FLOAT6E2M3), "holds 64 bytes but its shape [4, 4] needs 12"),
        (lambda w: setattr(w, "data_type", 77), "unknown element type 77"),
        (lambda w: w.ClearField("raw_data"), "holds 0 values but its shape [4, 4] needs 16"),
        (lambda w: w.dims.__setitem__(0, -4), "negative dimension"),
    ],
    ids=["shape", "dtype", "unknown-dtype", "no-data", "negative-dim"],
)
def test_initializer_whose_data_does_not_match_its_type(tmp_path, change, needle):
    m = good_model()
    change(m.graph.initializer[0])
    refused(write(tmp_path, m), "tensor 'w'", needle)


def test_graph_input_of_unknown_element_type(tmp_path):
    m = good_model()
    m.graph.input[0].type.tensor_type.elem_type = 99
    refused(write(tmp_path, m), "'x' has unknown element type 99")


# --------------------------------------------------------------------------------------- large/deep


def test_model_over_2_gib_without_external_data(tmp_path):
    """A genuine >2 GiB protobuf (one initializer's raw_data), written as a sparse file: refused from
    its size, before a byte of it is read."""
    n = (PROTOBUF_LIMIT + 1024) // 4
    small = make(
        [helper.make_node("Add", ["x", "w"], ["y"])], [vi("x", F32, [n])], [vi("y", F32, [n])], opset=18
    )
    graph_head = small.graph.SerializeToString()
    tensor_head = onnx.TensorProto(name="w", dims=[n], data_type=TensorProto.FLOAT).SerializeToString()
    raw_len = n * 4
    tensor_len = len(tensor_head) + len(_varint(9 << 3 | 2)) + len(_varint(raw_len)) + raw_len
    graph_len = len(graph_head) + len(_varint(5 << 3 | 2)) + len(_varint(tensor_len)) + tensor_len
    model_head = onnx.ModelProto(ir_version=9, opset_import=[helper.make_opsetid("", 18)]).SerializeToString()
    head = (
        model_head + _varint(7 << 3 | 2) + _varint(graph_len) + graph_head
        + _varint(5 << 3 | 2) + _varint(tensor_len) + tensor_head + _varint(9 << 3 | 2) + _varint(raw_len)
    )
    p = tmp_path / "huge.onnx"
    with open(p, "wb") as f:
        f.write(head)
        f.truncate(len(head) + raw_len)  # zeros, as a hole: no disk space used
    assert p.stat().st_size > PROTOBUF_LIMIT
    refused(p, "GiB", "2 GiB limit", "external data")


def _nested_if_bytes(depth: int) -> bytes:
    """A model whose If nodes nest ``depth`` deep, serialized by hand (onnx's helpers cannot even
    build messages deeper than protobuf parses)."""
    inner = helper.make_graph(
        [helper.make_node("MatMul", ["x", "x"], [f"y{depth}"])], f"g{depth}", [], [vi(f"y{depth}", F32, [2, 2])]
    ).SerializeToString()
    for d in range(depth - 1, -1, -1):
        other = helper.make_graph([helper.make_node("Relu", ["x"], [f"e{d}"])], f"e{d}", [], [vi(f"e{d}", F32, [2, 2])])
        then_attr = onnx.AttributeProto(name="then_branch", type=onnx.AttributeProto.GRAPH).SerializeToString()
        then_attr += _field(6, inner)
        node = helper.make_node("If", ["c"], [f"y{d}"], else_branch=other, name=f"if{d}").SerializeToString()
        node += _field(5, then_attr)
        graph = helper.make_graph(
            [], f"g{d}", [vi("x", F32, [2, 2]), vi("c", TensorProto.BOOL, [])] if d == 0 else [],
            [vi(f"y{d}", F32, [2, 2])],
        ).SerializeToString()
        inner = graph + _field(1, node)
    head = onnx.ModelProto(ir_version=9, opset_import=[helper.make_opsetid("", 18)]).SerializeToString()
    return head + _field(7, inner)


def test_deeply_nested_subgraphs_convert(tmp_path):
    p = write(tmp_path, _nested_if_bytes(30))
    out = tmp_path / "out.onnx"
    code, _, err = cli(["convert", p, "-o", out, "-q"])
    assert code == 0, err
    converted = onnx.load(out)
    validate(converted)
    x = np.random.default_rng(0).uniform(-1, 1, (2, 2)).astype(np.float32)
    from amp_compiler.onnx.measure.checks import run_onnxruntime

    for c in (True, False):
        feeds = {"x": x, "c": np.array(c)}
        ref, got = run_onnxruntime(onnx.load(p), feeds)[0], run_onnxruntime(converted, feeds)[0]
        np.testing.assert_allclose(got, ref, rtol=1e-2, atol=1e-2)


def test_subgraphs_nested_deeper_than_protobuf_parses(tmp_path):
    refused(write(tmp_path, _nested_if_bytes(60)), "deeper than protobuf can parse")


def test_very_long_names_convert(tmp_path):
    long = "n" * 1_000_000
    m = make(
        [
            helper.make_node("MatMul", ["x" + long, "w" + long], ["a" + long], name="mm" + long),
            helper.make_node("Relu", ["a" + long], ["y" + long], name="relu" + long),
        ],
        [vi("x" + long, F32, [2, 4])], [vi("y" + long, F32, [2, 4])], [tensor("w" + long, weights((4, 4)))],
        name="graph" + long,
    )
    p = write(tmp_path, m)
    out = tmp_path / "out.onnx"
    code, stdout, err = cli(["convert", p, "-o", out])
    assert code == 0, err
    assert len(stdout) < 1000  # the summary does not print names
    converted = onnx.load(out)
    validate(converted)
    assert converted.graph.name == "graph" + long
    assert [o.name for o in converted.graph.output] == ["y" + long]


def test_long_and_multiline_names_keep_the_error_to_one_short_line(tmp_path):
    ghost = "line one\nline two\r\x1b[31m" + "g" * 100_000
    m = make([helper.make_node("Add", ["x", ghost], ["y"], name="a\nb")], [X], [Y])
    line = refused(write(tmp_path, m), "reads tensor")
    assert len(line) < 700 and "\x1b" not in line


# ------------------------------------------------------------------------------------- external data


def _external_model(tmp_path: Path, location: str, *, offset=0, length: int | None = None, shape=(4, 4)):
    """A model with one initializer stored as external data at ``location`` (nothing is written there)."""
    m = good_model()
    w = m.graph.initializer[0]
    w.ClearField("raw_data")
    del w.float_data[:]
    del w.dims[:]
    w.dims.extend(shape)
    w.data_location = TensorProto.EXTERNAL
    entries = {"location": location, "offset": str(offset)}
    if length is not None:
        entries["length"] = str(length)
    for k, v in entries.items():
        w.external_data.add(key=k, value=v)
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    return write(folder, m)


_WEIGHTS = weights((4, 4)).tobytes()


class _Opened:
    """Records every file the process opens (Python audit hook: onnx's and our reads both go through
    builtins.open / os.open). Audit hooks cannot be removed, so the hook checks a flag."""

    paths: list[str] = []
    active = False
    installed = False

    @classmethod
    def hook(cls, event, args):
        if cls.active and event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
            cls.paths.append(os.fsdecode(args[0]))

    def __enter__(self):
        if not _Opened.installed:
            sys.addaudithook(_Opened.hook)
            _Opened.installed = True
        _Opened.paths = []
        _Opened.active = True
        return _Opened.paths

    def __exit__(self, *exc):
        _Opened.active = False


def test_external_data_loads_and_converts(tmp_path):
    p = _external_model(tmp_path, "weights/w.bin", length=len(_WEIGHTS))
    (p.parent / "weights").mkdir()
    (p.parent / "weights" / "w.bin").write_bytes(_WEIGHTS)
    out = tmp_path / "out.onnx"
    code, _, err = cli(["convert", p, "-o", out, "-q"])
    assert code == 0, err
    w = next(t for t in onnx.load(out).graph.initializer if t.name == "w")
    assert w.data_location == TensorProto.DEFAULT
    np.testing.assert_array_equal(numpy_helper.to_array(w), weights((4, 4)).astype(np.float16))


def test_external_data_at_an_offset_and_through_a_symlink_inside_the_folder(tmp_path):
    p = _external_model(tmp_path, "link.bin", offset=8)
    (p.parent / "real.bin").write_bytes(b"\x00" * 8 + _WEIGHTS)
    (p.parent / "link.bin").symlink_to("real.bin")
    np.testing.assert_array_equal(numpy_helper.to_array(load_model(p).graph.initializer[0]), weights((4, 4)))


def test_external_data_file_missing(tmp_path):
    refused(_external_model(tmp_path, "nowhere.bin"), "'w'", "'nowhere.bin'", "missing")


@pytest.mark.parametrize("declared", ["length", "shape"])
def test_external_data_shorter_than_declared(tmp_path, declared):
    if declared == "length":  # the length field asks for more than the file holds
        p = _external_model(tmp_path, "w.bin", length=len(_WEIGHTS) * 2, shape=(4, 8))
    else:  # no length: the shape asks for more
        p = _external_model(tmp_path, "w.bin", shape=(4, 8))
    (p.parent / "w.bin").write_bytes(_WEIGHTS)
    refused(p, "shorter than declared")


def test_external_data_length_disagreeing_with_the_shape(tmp_path):
    p = _external_model(tmp_path, "w.bin", length=12)
    (p.parent / "w.bin").write_bytes(_WEIGHTS)
    refused(p, "does not match its shape")


def test_external_data_offset_past_the_end(tmp_path):
    p = _external_model(tmp_path, "w.bin", offset=10_000)
    (p.parent / "w.bin").write_bytes(_WEIGHTS)
    refused(p, "shorter than declared")


@pytest.mark.parametrize("location", ["", "w.bin\x00.txt"])
def test_external_data_location_malformed(tmp_path, location):
    refused(_external_model(tmp_path, location), "'w'")


def test_external_data_location_is_a_directory(tmp_path):
    p = _external_model(tmp_path, "sub")
    (p.parent / "sub").mkdir()
    refused(p, "not a regular file")


def _secret(tmp_path: Path) -> Path:
    """A file outside the model's folder holding valid weights: reading it would 'work'."""
    s = tmp_path / "secret.bin"
    s.write_bytes(_WEIGHTS)
    return s


@pytest.mark.parametrize(
    "location, needle",
    [
        ("../secret.bin", "escapes the model's folder"),
        ("sub/../../secret.bin", "escapes the model's folder"),
        ("..\\secret.bin", "escapes the model's folder"),
        ("ABSOLUTE", "absolute path"),
        ("C:\\secret.bin", "absolute path"),
        ("\\\\server\\share\\secret.bin", "absolute path"),
    ],
)
def test_external_data_escaping_the_folder_is_refused_and_never_read(tmp_path, location, needle):
    secret = _secret(tmp_path)
    if location == "ABSOLUTE":
        location = str(secret)
    p = _external_model(tmp_path, location)
    (p.parent / "sub").mkdir()
    with _Opened() as opened:
        refused(p, needle, "refused")
    assert not [o for o in opened if "secret" in o], opened


@pytest.mark.parametrize("how", ["file", "folder", "chain"])
def test_external_data_symlinked_out_of_the_folder_is_refused_and_never_read(tmp_path, how):
    secret = _secret(tmp_path)
    p = _external_model(tmp_path, {"file": "w.bin", "folder": "data/w.bin", "chain": "a.bin"}[how])
    if how == "file":
        (p.parent / "w.bin").symlink_to(secret)
    elif how == "folder":
        (p.parent / "data").symlink_to(tmp_path)  # a folder link pointing up
        shutil.copy(secret, tmp_path / "w.bin")
    else:
        (p.parent / "b.bin").symlink_to("../secret.bin")
        (p.parent / "a.bin").symlink_to("b.bin")
    with _Opened() as opened:
        refused(p, "outside the model's folder", "refused")
    assert not [o for o in opened if o.endswith(("secret.bin", "w.bin", "a.bin", "b.bin"))], opened


def test_external_data_in_a_subgraph_and_a_constant_attribute_is_validated_too(tmp_path):
    secret = _secret(tmp_path)
    t = numpy_helper.from_array(np.zeros((4, 4), np.float32), "c")
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    t.external_data.add(key="location", value="../secret.bin")
    body = helper.make_graph(
        [helper.make_node("Constant", [], ["k"], value=t), helper.make_node("Add", ["x", "k"], ["p"])], "then", [],
        [vi("p", F32, [4, 4])],
    )
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["r"])], "else", [], [vi("r", F32, [4, 4])])
    m = make(
        [helper.make_node("If", ["c0"], ["y"], then_branch=body, else_branch=other)],
        [vi("x", F32, [4, 4]), vi("c0", TensorProto.BOOL, [])], [vi("y", F32, [4, 4])],
    )
    folder = tmp_path / "model"
    folder.mkdir()
    with _Opened() as opened:
        refused(write(folder, m), "escapes the model's folder")
    assert str(secret) not in opened


def test_in_memory_model_with_unloaded_external_data_is_refused(tmp_path, monkeypatch):
    p = _external_model(tmp_path, "w.bin")
    (p.parent / "w.bin").write_bytes(_WEIGHTS)
    m = onnx.load(p, load_external_data=False)
    monkeypatch.chdir(p.parent)  # even where the relative location would resolve, nothing is read
    with pytest.raises(ModelLoadError, match="external data that is not loaded"):
        convert(m, probe=False)


def test_output_over_the_inputs_external_data_is_refused(tmp_path):
    p = _external_model(tmp_path, "w.bin")
    data = p.parent / "w.bin"
    data.write_bytes(_WEIGHTS)
    refused(p, "external data", out=data)
    code, _, err = cli(["convert", p, "-o", data, "--force"])
    assert code == 2 and "external data" in err
    assert data.read_bytes() == _WEIGHTS


# --------------------------------------------------------------------------------------- output paths


@pytest.fixture
def model_file(tmp_path) -> Path:
    return write(tmp_path, good_model(), "good.onnx")


def test_output_folder_missing_is_reported_before_any_work(model_file, tmp_path, monkeypatch):
    import amp_compiler.onnx.load.files as io  # the CLI loads through this module

    for loader in ("load_model_deferred", "load_model_and_files", "load_model"):
        monkeypatch.setattr(io, loader, lambda *a, **k: pytest.fail("loaded before checking the output"))
    refused(model_file, "does not exist", out=tmp_path / "missing" / "o.onnx")


def test_output_folder_is_a_file(model_file, tmp_path):
    refused(model_file, "not a directory", out=model_file / "o.onnx")


def test_output_is_a_directory(model_file, tmp_path):
    (tmp_path / "d.onnx").mkdir()
    refused(model_file, "is a directory", out=tmp_path / "d.onnx")


def test_output_folder_not_writable(model_file, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() != 0:
        ro.chmod(0o500)
    else:  # root ignores permission bits: an immutable folder refuses it too
        if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(ro)]).returncode != 0:
            pytest.skip("running as root without chattr +i: cannot make a folder unwritable")
    try:
        refused(model_file, "not writable", out=ro / "o.onnx")
        assert list(ro.iterdir()) == []
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(ro)])
        ro.chmod(0o700)


@pytest.mark.parametrize("spelling", ["dot", "symlink", "hardlink"])
def test_output_equal_to_input_under_another_name_is_refused(model_file, tmp_path, monkeypatch, spelling):
    before = model_file.read_bytes()
    monkeypatch.chdir(tmp_path)
    if spelling == "dot":
        out = Path(".") / "sub" / ".." / model_file.name
        (tmp_path / "sub").mkdir()
    elif spelling == "symlink":
        out = tmp_path / "link.onnx"
        out.symlink_to(model_file)
    else:
        out = tmp_path / "hard.onnx"
        os.link(model_file, out)
    refused(model_file, "overwrite the input", out=out)
    assert model_file.read_bytes() == before


def test_force_converts_in_place(model_file):
    code, _, err = cli(["convert", model_file, "-o", model_file, "--force", "-q"])
    assert code == 0, err
    m = onnx.load(model_file)
    validate(m)
    assert any(t.data_type == TensorProto.FLOAT16 for t in m.graph.initializer)


def test_new_output_file_gets_ordinary_permissions(model_file, tmp_path):
    old = os.umask(0o022)
    try:
        out = tmp_path / "o.onnx"
        assert cli(["convert", model_file, "-o", out, "-q"])[0] == 0
        assert stat.S_IMODE(out.stat().st_mode) == 0o644
        out.chmod(0o640)  # replacing a file keeps its permissions
        assert cli(["convert", model_file, "-o", out, "-q"])[0] == 0
        assert stat.S_IMODE(out.stat().st_mode) == 0o640
    finally:
        os.umask(old)


def test_hostile_file_through_the_console_script(tmp_path):
    """The installed entry point, not just main(): no traceback, exit 2."""
    bad = write(tmp_path, b"\x08\x09\x12\x00garbage")
    proc = subprocess.run(
        [sys.executable, "-m", "amp_compiler.cli", "convert", str(bad), "-o", str(tmp_path / "o.onnx")],
        capture_output=True, text=True,
    )
    assert proc.returncode == 2 and proc.stderr.startswith("amp-compiler: error: ")
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "o.onnx").exists()


# ------------------------------------------------------------------------ outputs too large to inline


def test_a_model_protobuf_cannot_serialize_is_a_clear_output_error(tmp_path):
    """upb raises EncodeError (not ValueError) for a message of 2 GiB or more: still one clear line."""
    from google.protobuf.message import EncodeError

    import amp_compiler.onnx.write.save as io

    class TooLarge:
        def SerializeToString(self):
            raise EncodeError("Failed to serialize proto")

    with pytest.raises(io.OutputError, match="cannot write the converted model"):
        io.save_model(TooLarge(), tmp_path / "out.onnx")
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------- large external weights (left on disk by the CLI)

_BIG = (160, 160)  # 100 KiB: over DEFER_MIN_BYTES, so the CLI leaves it on disk until it is needed
_BIG_BYTES = weights(_BIG).tobytes()


def _big_external_model(tmp_path: Path, location: str) -> Path:
    m = make(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        [vi("x", F32, [2, 160])], [vi("y", F32, [2, 160])], [tensor("w", weights(_BIG))],
    )
    w = m.graph.initializer[0]
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    w.external_data.add(key="location", value=location)
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    return write(folder, m)


def test_large_external_weights_convert_through_the_deferred_path(tmp_path):
    from amp_compiler.onnx.load.files import DEFER_MIN_BYTES

    assert len(_BIG_BYTES) >= DEFER_MIN_BYTES
    p = _big_external_model(tmp_path, "w.bin")
    (p.parent / "w.bin").write_bytes(_BIG_BYTES)
    out = tmp_path / "out.onnx"
    code, _, err = cli(["convert", p, "-o", out, "-q"])
    assert code == 0, err
    w = next(t for t in load_model(out).graph.initializer if t.name == "w")
    np.testing.assert_array_equal(numpy_helper.to_array(w), weights(_BIG).astype(np.float16))


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink"])
def test_large_external_weights_escaping_the_folder_are_refused_and_never_read(tmp_path, how):
    secret = tmp_path / "secret.bin"
    secret.write_bytes(_BIG_BYTES)
    location = {"dotdot": "../secret.bin", "absolute": str(secret), "symlink": "w.bin"}[how]
    p = _big_external_model(tmp_path, location)
    if how == "symlink":
        (p.parent / "w.bin").symlink_to(secret)
    with _Opened() as opened:
        refused(p, "refused")
    assert not [o for o in opened if o.endswith(("secret.bin", "w.bin"))], opened


@pytest.mark.parametrize("size", [0, len(_BIG_BYTES) // 2])
def test_large_external_weights_missing_or_short(tmp_path, size):
    p = _big_external_model(tmp_path, "w.bin")
    if size:
        (p.parent / "w.bin").write_bytes(_BIG_BYTES[:size])
        refused(p, "shorter than declared")
    else:
        refused(p, "missing")


def test_external_data_that_shrinks_after_validation_is_a_clear_error(tmp_path):
    """Validated, then truncated before the conversion reads it (a file changed under us)."""
    from amp_compiler.onnx.load.files import load_model_deferred

    p = _big_external_model(tmp_path, "w.bin")
    data = p.parent / "w.bin"
    data.write_bytes(_BIG_BYTES)
    loaded = load_model_deferred(p)
    assert loaded.deferred
    data.write_bytes(_BIG_BYTES[:100])
    with pytest.raises(ModelLoadError, match="shorter than declared"):
        convert(loaded, probe=False)


def test_external_tensor_without_a_location_is_named(tmp_path):
    """A tensor marked as external data with no "location" entry: the file-level shortcut that skips
    the external-data plan (no "location" anywhere in the file) still reports it precisely."""
    import subprocess
    import sys

    w = numpy_helper.from_array(np.ones((2, 2), np.float32), "w")
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    entry = w.external_data.add()
    entry.key, entry.value = "offset", "0"
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])], [w],
    )
    path = tmp_path / "m.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString())
    proc = subprocess.run(
        [sys.executable, "-m", "amp_compiler.cli", "convert", str(path), "-o", str(tmp_path / "o.onnx")],
        capture_output=True, text=True,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().endswith("stored as external data but names no location")
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o.onnx").exists()
