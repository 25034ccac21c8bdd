"""Nothing lost: a conversion changes precisions and adds Casts, and nothing else.

Metadata, doc strings, opset imports, IR version, model and graph names, the names, shapes and
(with keep_io_types) types of graph inputs and outputs, model-local functions and their bodies, node
names and unrelated attributes all survive; and a conversion that fails midway leaves the output
path as it was.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import amp_compiler.onnx.write.save as onnx_save  # the module that writes the output
from amp_compiler import convert
from amp_compiler.cli import main
from amp_compiler.onnx.load.proto_walk import iter_proto_graphs
from amp_compiler.onnx.measure.checks import run_onnxruntime, validate

vi = helper.make_tensor_value_info

# Attributes a conversion may legitimately rewrite: the dtype a Cast produces, and constants it
# converts offline.
_DTYPE_ATTRIBUTES = {("Cast", "to"), ("Constant", "value"), ("ConstantOfShape", "value")}


def rich_model() -> onnx.ModelProto:
    """A model with something of everything a conversion must keep."""
    scale2 = helper.make_function(
        "local.fn", "Scale2", ["a"], ["b"],
        [
            helper.make_node("Constant", [], ["two"], value=helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])),
            helper.make_node("Mul", ["a", "two"], ["b"], name="fn_mul"),
        ],
        [helper.make_opsetid("", 20)], doc_string="doubles its input",
    )
    then = helper.make_graph(
        [helper.make_node("MatMul", ["h", "w"], ["t_out"], name="then/mm", doc_string="branch matmul")],
        "then_graph", [], [vi("t_out", TensorProto.FLOAT, ["batch", 4])], doc_string="then doc",
    )
    other = helper.make_graph(
        [helper.make_node("Softmax", ["h"], ["e_out"], name="else/softmax", axis=-1)],
        "else_graph", [], [vi("e_out", TensorProto.FLOAT, ["batch", 4])],
    )
    nodes = [
        helper.make_node("MatMul", ["input:0", "w"], ["h"], name="encoder/mm", doc_string="the first matmul"),
        helper.make_node("Scale2", ["h"], ["s"], domain="local.fn", name="encoder/scale"),
        helper.make_node("If", ["flag"], ["branch"], name="encoder/if", then_branch=then, else_branch=other),
        helper.make_node(
            "Conv", ["image", "kernel"], ["conv_out"], name="vision/conv",
            dilations=[1, 1], group=1, pads=[1, 1, 1, 1], strides=[1, 1], kernel_shape=[3, 3],
        ),
        helper.make_node("LeakyRelu", ["conv_out"], ["features out"], name="vision/act", alpha=0.125),
        helper.make_node("Add", ["s", "branch"], ["sum"], name="encoder/add"),
        helper.make_node("Gelu", ["sum"], ["logits/0"], name="encoder/gelu", approximate="tanh"),
        helper.make_node("Shape", ["input:0"], ["shape"], name="shape", start=0),
        helper.make_node(
            "Frobnicate", ["sum"], ["custom"], domain="com.example", name="custom",
            mode="fast", weights=[1.0, 2.0], note=b"bytes attribute",
        ),
    ]
    graph = helper.make_graph(
        nodes, "my encoder graph",
        [vi("input:0", TensorProto.FLOAT, ["batch", 4]), vi("image", TensorProto.FLOAT, [1, 2, 5, 5]),
         vi("flag", TensorProto.BOOL, [])],
        [vi("logits/0", TensorProto.FLOAT, ["batch", 4]), vi("features out", TensorProto.FLOAT, [1, 3, 5, 5]),
         vi("shape", TensorProto.INT64, [2]), vi("custom", TensorProto.FLOAT, ["batch", 4])],
        [numpy_helper.from_array(np.eye(4, dtype=np.float32) * 0.5, "w"),
         numpy_helper.from_array(np.full((3, 2, 3, 3), 0.05, np.float32), "kernel")],
        doc_string="graph documentation",
        value_info=[vi("h", TensorProto.FLOAT, ["batch", 4])],
    )
    graph.initializer[0].doc_string = "weights doc"
    graph.input[0].doc_string = "input doc"
    m = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("local.fn", 1),
                       helper.make_opsetid("com.example", 3), helper.make_opsetid("ai.onnx.ml", 3)],
        functions=[scale2], producer_name="exporter", producer_version="9.9", domain="org.example",
        model_version=42, doc_string="model documentation",
    )
    helper.set_model_props(m, {"author": "somebody", "license": "Apache-2.0", "empty": ""})
    m.ir_version = 9
    onnx.checker.check_model(m, full_check=True)
    return m


def _io(values) -> list[tuple]:
    return [(v.name, v.doc_string, v.type.SerializeToString()) for v in values]


def _other_attributes(node: onnx.NodeProto) -> list[bytes]:
    return [
        a.SerializeToString() for a in node.attribute
        if (node.op_type, a.name) not in _DTYPE_ATTRIBUTES and a.type not in (a.GRAPH, a.GRAPHS)
    ]


@pytest.fixture(scope="module")
def original() -> onnx.ModelProto:
    return rich_model()


@pytest.fixture(scope="module", params=["fp16", "bf16"])
def converted(request, original) -> onnx.ModelProto:
    before = original.SerializeToString()
    out = convert(original, target=request.param, probe=False).model
    assert original.SerializeToString() == before, "convert() modified its input"
    validate(out)
    return out


def test_model_fields_survive(original, converted):
    for field in ("ir_version", "producer_name", "producer_version", "domain", "model_version", "doc_string"):
        assert getattr(converted, field) == getattr(original, field), field
    # a map: onnx_ir writes entries with empty values last, which changes no meaning
    assert {p.key: p.value for p in converted.metadata_props} == {p.key: p.value for p in original.metadata_props}
    assert len(converted.metadata_props) == len(original.metadata_props)
    assert sorted((o.domain, o.version) for o in converted.opset_import) == sorted(
        (o.domain, o.version) for o in original.opset_import
    )


def test_graph_name_doc_and_io_survive(original, converted):
    assert converted.graph.name == original.graph.name
    assert converted.graph.doc_string == original.graph.doc_string
    assert _io(converted.graph.input) == _io(original.graph.input)  # names, docs, types, symbolic dims
    assert _io(converted.graph.output) == _io(original.graph.output)


def test_functions_and_their_bodies_survive(original, converted):
    assert [f.SerializeToString() for f in converted.functions] == [
        f.SerializeToString() for f in original.functions
    ]


def test_nodes_keep_names_docs_and_unrelated_attributes(original, converted):
    after = {n.name: n for g in iter_proto_graphs(converted.graph) for n in g.node if n.name}
    for g in iter_proto_graphs(original.graph):
        for node in g.node:
            assert node.name in after, node.name
            new = after[node.name]
            assert (new.op_type, new.domain, new.doc_string) == (node.op_type, node.domain, node.doc_string)
            assert _other_attributes(new) == _other_attributes(node), node.name


def test_subgraph_names_and_docs_survive(original, converted):
    def graphs(m):
        return [(g.name, g.doc_string) for g in iter_proto_graphs(m.graph)]

    assert graphs(converted) == graphs(original)


def test_initializer_names_survive(original, converted):
    assert {t.name for t in original.graph.initializer} <= {t.name for t in converted.graph.initializer}


def test_unconverted_initializer_keeps_its_doc_string():
    m = _doc_model()
    out = convert(m, probe=False).model
    assert {t.name: t.doc_string for t in out.graph.initializer}["shape"] == "shape doc"


def test_converted_initializer_keeps_its_doc_string():
    out = convert(_doc_model(), probe=False).model
    w = next(t for t in out.graph.initializer if t.name == "w")
    assert w.data_type == TensorProto.FLOAT16
    assert w.doc_string == "w doc"


def _doc_model() -> onnx.ModelProto:
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Reshape", ["y", "shape"], ["z"])], "g",
        [vi("x", TensorProto.FLOAT, [2, 16])], [vi("z", TensorProto.FLOAT, [32])],  # K = 16 (raw-small-product)
        [numpy_helper.from_array(np.eye(16, dtype=np.float32), "w"),
         numpy_helper.from_array(np.array([32], np.int64), "shape")],
    )
    g.initializer[0].doc_string = "w doc"
    g.initializer[1].doc_string = "shape doc"
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    return m


def test_converted_model_computes_the_same(original, converted):
    if any(i.data_type == TensorProto.BFLOAT16 for i in converted.graph.initializer):
        pytest.skip("expected: BF16 accuracy is checked by the fuzzer through emulation")
    # the custom op has no kernel: check the rest of the graph
    def runnable(m):
        m = onnx.ModelProto.FromString(m.SerializeToString())
        keep = [o for o in m.graph.output if o.name != "custom"]
        del m.graph.output[:]
        m.graph.output.extend(keep)
        nodes = [n for n in m.graph.node if n.op_type != "Frobnicate"]
        del m.graph.node[:]
        m.graph.node.extend(nodes)
        return m

    rng = np.random.default_rng(0)
    for flag in (True, False):
        feeds = {"input:0": rng.uniform(-1, 1, (3, 4)).astype(np.float32),
                 "image": rng.uniform(-1, 1, (1, 2, 5, 5)).astype(np.float32), "flag": np.array(flag)}
        ref = run_onnxruntime(runnable(original), feeds)
        got = run_onnxruntime(runnable(converted), feeds)
        for r, g in zip(ref, got):
            assert r.dtype == g.dtype and r.shape == g.shape
            np.testing.assert_allclose(g, r, rtol=1e-2, atol=1e-2)


def test_cli_keeps_everything_too(tmp_path, original):
    src, dst = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(original, src)
    assert main(["convert", str(src), "-o", str(dst), "-q"]) == 0
    out = onnx.load(dst)
    assert {p.key: p.value for p in out.metadata_props} == {p.key: p.value for p in original.metadata_props}
    assert _io(out.graph.input) == _io(original.graph.input)
    assert [f.SerializeToString() for f in out.functions] == [f.SerializeToString() for f in original.functions]


# ------------------------------------------------------------------- failures leave the output alone


@pytest.fixture
def paths(tmp_path, original):
    src, dst = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(original, src)
    dst.write_bytes(b"the previous output")
    return src, dst


def _cli(argv) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main([str(a) for a in argv])
    return code, err.getvalue()


def _untouched(dst: Path) -> None:
    assert dst.read_bytes() == b"the previous output"
    assert [p.name for p in dst.parent.iterdir() if p.name.startswith(".out.onnx")] == []


def test_internal_error_during_conversion_leaves_output_untouched(paths, monkeypatch):
    import importlib

    convert_module = importlib.import_module("amp_compiler.onnx.convert")  # the module, not the function

    def crash(*a, **k):
        raise RuntimeError("simulated bug in a pass")

    monkeypatch.setattr(convert_module, "LowerPlanPass", crash)
    src, dst = paths
    code, err = _cli(["convert", src, "-o", dst])
    assert code == 1 and "internal error" in err and "simulated bug" in err
    _untouched(dst)


@pytest.mark.parametrize("where", ["write", "fsync", "replace"])
def test_failure_while_writing_leaves_output_untouched(paths, monkeypatch, where):
    src, dst = paths
    if where == "write":
        real_fdopen = os.fdopen

        class Full:
            def __init__(self, f):
                self.f = f

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self.f.close()

            def write(self, data):
                self.f.write(data[: len(data) // 2])
                raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(onnx_save.os, "fdopen", lambda fd, mode: Full(real_fdopen(fd, mode)))
    elif where == "fsync":
        monkeypatch.setattr(onnx_save.os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(errno.EIO, "I/O error")))
    else:
        monkeypatch.setattr(onnx_save.os, "replace", lambda a, b: (_ for _ in ()).throw(OSError(errno.EXDEV, "cross-device")))
    code, err = _cli(["convert", src, "-o", dst])
    assert code == 2 and "cannot write" in err, err
    _untouched(dst)


def test_interrupt_while_writing_leaves_output_untouched(paths, monkeypatch):
    src, dst = paths

    def interrupted(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(onnx_save.os, "fsync", interrupted)
    code, err = _cli(["convert", src, "-o", dst])
    assert code == 130 and "interrupted" in err
    _untouched(dst)


def test_refused_input_leaves_output_untouched(paths):
    src, dst = paths
    src.write_bytes(src.read_bytes()[:100])  # truncated
    code, err = _cli(["convert", src, "-o", dst])
    assert code == 2
    _untouched(dst)
