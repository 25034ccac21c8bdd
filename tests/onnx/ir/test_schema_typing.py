"""Element types from op schemas where onnx's shape inference gives none, and what stays unknown.

- A contrib op (com.microsoft) has no onnx schema, so onnx's inference types neither its output nor
  what follows it; its onnxruntime schema's type constraints do (the vertex takes the type of any
  slot that has one), and the graph converts to FP16.
- A custom op no schema describes leaves its tensors untyped: those nodes stay as they are, the
  summary line counts them, the report does not count them low precision, ``strict`` refuses them.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import helper

from amp_compiler import convert
from amp_compiler.analysis import analyze
from amp_compiler.cli import main
from amp_compiler.errors import UntypedTensorsError
from amp_compiler.onnx.ir.schema_typing import type_from_schemas, untyped_values
from amp_compiler.onnx.measure.checks import run_onnxruntime, validate
from amp_compiler.options import ConvertOptions
from tests.support.onnx_builders import F32, tensor, vi, weights

MS = helper.make_opsetid("com.microsoft", 1)


def _contrib_model() -> onnx.ModelProto:
    """x -> MatMul -> FastGelu (com.microsoft) -> MatMul -> SkipLayerNormalization -> y, no value_info."""
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
        helper.make_node("FastGelu", ["h"], ["g"], name="gelu", domain="com.microsoft"),
        helper.make_node("MatMul", ["g", "w2"], ["m"], name="mm2"),
        helper.make_node("SkipLayerNormalization", ["m", "x", "gamma", "beta"], ["y"], name="sln",
                         domain="com.microsoft", epsilon=1e-5),
    ]
    graph = helper.make_graph(
        nodes, "g", [vi("x", F32, ["batch", 16])], [vi("y", F32, ["batch", 16])],
        [tensor("w1", weights((16, 32))), tensor("w2", weights((32, 16), 1)),
         tensor("gamma", np.ones(16, np.float32)), tensor("beta", np.zeros(16, np.float32))],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), MS])
    m.ir_version = 9
    return m


def test_onnx_inference_leaves_the_contrib_op_and_its_successors_untyped() -> None:
    inferred = onnx.shape_inference.infer_shapes(_contrib_model())
    typed = {v.name for v in inferred.graph.value_info if v.type.tensor_type.elem_type}
    assert "h" in typed and "g" not in typed and "m" not in typed


def test_the_schema_types_them() -> None:
    model = ir.from_proto(onnx.shape_inference.infer_shapes(_contrib_model()))
    assert {v.name for v in untyped_values(model)} == {"g", "m"}
    assert type_from_schemas(model) == 2
    assert untyped_values(model) == []
    by_name = {v.name: v for node in model.graph for v in node.outputs}
    assert by_name["g"].dtype == ir.DataType.FLOAT and by_name["m"].dtype == ir.DataType.FLOAT
    assert by_name["g"].shape is None  # element types only, never shapes


def test_a_contrib_op_typed_only_through_its_schema_converts() -> None:
    m = _contrib_model()
    result = convert(m, probe=False)
    by_node = {d.node: d for d in result.decisions}
    assert by_node["gelu"].precision == "fp16" and by_node["mm2"].precision == "fp16"
    assert by_node["gelu"].output_dtypes == ["fp16"]
    assert not result.untyped_nodes
    validate(result.model)
    x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
    np.testing.assert_allclose(run_onnxruntime(result.model, {"x": x})[0], run_onnxruntime(m, {"x": x})[0], atol=0.02)


def test_classes_that_disagree_are_left_alone() -> None:
    """Two inputs of one type parameter with different types (an invalid model): nothing is guessed."""
    nodes = [helper.make_node("Add", ["a", "b"], ["c"]), helper.make_node("Relu", ["c"], ["d"])]
    graph = helper.make_graph(nodes, "g", [vi("a", F32, [2]), vi("b", onnx.TensorProto.FLOAT16, [2])],
                              [vi("d", F32, [2])])
    model = ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert type_from_schemas(model) == 0


def _custom_op_model() -> onnx.ModelProto:
    """x -> MatMul -> Mystery (com.example: no schema anywhere) -> Relu -> MatMul -> Riddle -> y, the
    second MatMul's weight made by a custom op too: nothing ties Relu and that MatMul to a known
    type, so they stay untyped."""
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
        helper.make_node("Mystery", ["h"], ["u"], name="mystery", domain="com.example"),
        helper.make_node("Mystery", ["w1"], ["w2"], name="weights", domain="com.example"),
        helper.make_node("Relu", ["u"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w2"], ["m"], name="mm2"),
        helper.make_node("Riddle", ["m"], ["y"], name="riddle", domain="com.example"),
    ]
    graph = helper.make_graph(nodes, "g", [vi("x", F32, [2, 16])], [vi("y", F32, [2, 16])],
                              [tensor("w1", weights((16, 16)))])  # K = 16: not policy.high.raw-small-product
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    m.ir_version = 9
    return m


def test_a_custom_ops_output_is_typed_by_its_users() -> None:
    """Relu and MatMul share their input's type with a typed weight: a custom op's output read there
    gets that type (nothing is left unknown)."""
    model = _custom_op_model()
    model.graph.node[4].input[1] = "w1"
    del model.graph.node[2]
    assert not convert(model, probe=False).untyped_nodes


def test_untyped_nodes_are_counted() -> None:
    result = convert(_custom_op_model(), probe=False)
    assert result.untyped_nodes == (
        "mystery (Mystery)", "weights (Mystery)", "relu (Relu)", "mm2 (MatMul)", "riddle (Riddle)"
    )
    by_node = {d.node: d for d in result.decisions}
    assert by_node["relu"].rule == "fixed.unknown-type" and by_node["relu"].precision != "fp16"
    assert by_node["mm2"].rule == "fixed.unknown-type" and by_node["mystery"].rule == "policy.unknown-op"
    assert by_node["mm1"].precision == "fp16"


def test_strict_refuses_them() -> None:
    with pytest.raises(UntypedTensorsError, match=r"5 node\(s\) left as they are .* mystery \(Mystery\)") as err:
        convert(_custom_op_model(), strict=True, probe=False)
    assert err.value.option == "strict"


def test_the_report_does_not_count_them_low_precision() -> None:
    report = analyze(_custom_op_model(), ConvertOptions(), input_shapes={"x": (2, 16)}).report
    summary = report.summary
    assert summary.untyped_nodes == 5
    untyped_flops = sum(n.flops or 0 for n in report.nodes if n.name in ("relu", "mm2"))
    assert untyped_flops > 0
    assert summary.flops_low <= summary.flops_total - untyped_flops
    assert any("left as they are" in w for w in report.warnings)


def test_cli_warns_on_the_summary_line_and_strict_exits_2(tmp_path, capsys) -> None:
    src = tmp_path / "m.onnx"
    onnx.save(_custom_op_model(), src)
    assert main(["convert", str(src), "-o", str(tmp_path / "out.onnx")]) == 0
    out = capsys.readouterr().out
    assert "WARNING: 5 node(s) of unknown element type left as they are" in out
    assert main(["convert", str(src), "-o", str(tmp_path / "strict.onnx"), "--strict"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("amp-compiler: error: --strict: 5 node(s) left as they are")
    assert not (tmp_path / "strict.onnx").exists()
