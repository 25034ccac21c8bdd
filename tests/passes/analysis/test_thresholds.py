"""Threshold readers (``threshold.input``): the op computing what a tree ensemble or a Binarizer reads, reached
through precision-neutral ops, stays FP32, so FP16 rounding moves no feature across a split or a threshold; a
Tensor Core op beside it, feeding no such op, still goes FP16."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from amp_compiler import convert
from amp_compiler.onnx.measure.checks import run_onnxruntime
from amp_compiler.onnx.measure.emulate import emulate
from tests.support.onnx_builders import F32, tensor, vi
from tests.support.onnx_builders import model as make_model

_ML = [helper.make_opsetid("ai.onnx.ml", 3)]


def _tree_model() -> onnx.ModelProto:
    """x -> MatMul "proj" -> Reshape "flat" -> TreeEnsembleRegressor splitting at 1000.3 (FP16 steps 0.5 there);
    x -> Tile -> MatMul "side" (K = 16) -> y2, read by no threshold op."""
    tree = helper.make_node(
        "TreeEnsembleRegressor", ["f"], ["y"], domain="ai.onnx.ml", name="tree", n_targets=1,
        nodes_treeids=[0, 0, 0], nodes_nodeids=[0, 1, 2], nodes_featureids=[0, 0, 0], nodes_values=[1000.3, 0.0, 0.0],
        nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"], nodes_truenodeids=[1, 0, 0], nodes_falsenodeids=[2, 0, 0],
        target_treeids=[0, 0], target_nodeids=[1, 2], target_ids=[0, 0], target_weights=[-1.0, 1.0])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["z"], name="proj"),
             helper.make_node("Reshape", ["z", "shape"], ["f"], name="flat"), tree,
             helper.make_node("Tile", ["x", "repeats"], ["x16"], name="tile"),
             helper.make_node("MatMul", ["x16", "w2"], ["y2"], name="side")]
    inits = [tensor("w", np.ones((1, 1), np.float32)), tensor("shape", np.array([-1, 1], np.int64)),
             tensor("repeats", np.array([1, 16], np.int64)), tensor("w2", np.ones((16, 16), np.float32) / 16)]
    return make_model(nodes, [vi("x", F32, ["N", 1])], [vi("y", F32, ["N", 1]), vi("y2", F32, ["N", 16])], inits,
                      opset=17, ir_version=8, extra_opsets=_ML)


def test_what_a_tree_reads_is_computed_in_fp32_through_a_reshape():
    m = _tree_model()
    result = convert(m, probe=False)
    by_node = {d.node: d for d in result.decisions}
    assert (by_node["proj"].precision, by_node["proj"].rule) == ("fp32", "threshold.input")
    assert (by_node["flat"].precision, by_node["flat"].rule) == ("fp32", "threshold.input")
    assert "TreeEnsembleRegressor node 'tree'" in by_node["proj"].reason
    assert by_node["side"].precision == "fp16"
    # FP16 rounding of the MatMul's result sent 5 of these 301 rows down the other branch (100% of the range)
    x = np.linspace(999, 1002, 301, dtype=np.float32).reshape(-1, 1)
    (want, _), (got, _) = (run_onnxruntime(mm, {"x": x}) for mm in (m, emulate(result.model)))
    np.testing.assert_array_equal(got, want)


def test_what_a_binarizer_reads_is_computed_in_fp32():
    nodes = [helper.make_node("Add", ["x", "b"], ["s"], name="shift"),
             helper.make_node("Binarizer", ["s"], ["y"], domain="ai.onnx.ml", name="bin", threshold=1000.3)]
    m = make_model(nodes, [vi("x", F32, ["N", 4])], [vi("y", F32, ["N", 4])],
                   [tensor("b", np.full(4, 0.1, np.float32))], opset=17, ir_version=8, extra_opsets=_ML)
    by_node = {d.node: d for d in convert(m, probe=False).decisions}
    assert (by_node["shift"].precision, by_node["shift"].rule) == ("fp32", "threshold.input")
    by_node = {d.node: d for d in convert(m, probe=False, allow_ops=["Add"]).decisions}
    assert by_node["shift"].precision == "fp16"  # the user's --allow-op is theirs to keep


def test_the_policy_says_why_for_every_threshold_reader():
    from amp_compiler.policy import default_table

    readers = {(p.domain, p.op): p.thresholds for p in default_table() if p.thresholds}
    assert {("ai.onnx.ml", op) for op in ("TreeEnsemble", "TreeEnsembleClassifier", "TreeEnsembleRegressor",
                                          "Binarizer")} <= readers.keys()
    assert all(len(why) > 40 for why in readers.values())


# ------------------------------------------------------------------ comparisons against constant operands
def _compare_after_matmul(op: str, constant: np.ndarray, via_reshape: bool = False) -> onnx.ModelProto:
    """x -> Relu -> MatMul "proj" -> ``op``(., constant) "cmp" -> Cast -> y (the constant reshaped first with
    ``via_reshape``; the Relu keeps the K = 3 product off the raw input, policy.high.raw-small-product's)."""
    c = "c_flat" if via_reshape else "c"
    nodes = [helper.make_node("Relu", ["x"], ["xr"], name="features"),
             helper.make_node("MatMul", ["xr", "w"], ["z"], name="proj"),
             helper.make_node(op, ["z", c], ["b"], name="cmp"),
             helper.make_node("Cast", ["b"], ["y"], to=onnx.TensorProto.FLOAT, name="to_float")]
    inits = [tensor("w", np.eye(3, dtype=np.float32))]
    if via_reshape:
        nodes.insert(0, helper.make_node("Reshape", ["c", "shape"], ["c_flat"], name="c_reshape"))
        inits += [tensor("c", constant.reshape(-1, 1)), tensor("shape", np.array([-1], np.int64))]
    else:
        inits.append(tensor("c", constant))
    return make_model(nodes, [vi("x", F32, ["N", 3])], [vi("y", F32, ["N", 3])], inits, opset=17, ir_version=8)


def _threshold_readers(m: onnx.ModelProto) -> dict[str, str]:
    """Per node whose vertex ``threshold_inputs`` finds, the node of the op that reads it."""
    import onnx_ir as ir

    from amp_compiler.onnx.graph.precision_graph import build_precision_graph
    from amp_compiler.passes.analysis.thresholds import threshold_inputs
    from amp_compiler.policy import default_table
    from amp_compiler.targets import Target

    graph = build_precision_graph(ir.from_proto(onnx.shape_inference.infer_shapes(m)), Target.FP16, default_table())
    return {graph.vertices[vid].node.name: reader.node.name for vid, reader in threshold_inputs(graph).items()
            if graph.vertices[vid].node is not None}


def test_a_comparison_with_a_vector_of_thresholds_reads_them_and_a_scalar_gate_does_not():
    vector = np.array([1000.3, 0.7, 52.1], np.float32)
    for op in ("Less", "LessOrEqual", "Greater", "GreaterOrEqual"):
        assert _threshold_readers(_compare_after_matmul(op, vector)) == {"proj": "cmp"}, op
        by_node = {d.node: d for d in convert(_compare_after_matmul(op, vector), probe=False).decisions}
        assert (by_node["proj"].precision, by_node["proj"].rule) == ("fp32", "threshold.input"), op
        assert f"{op} node 'cmp'" in by_node["proj"].reason
    # a Constant reached through a Reshape is the same vector of thresholds (which the Reshape keeps FP32 too)
    assert _threshold_readers(_compare_after_matmul("Less", vector, via_reshape=True)) == {"proj": "cmp",
                                                                                           "c_reshape": "cmp"}
    # Equal matches counts, exact in FP16: its producer stays low (a compiled tree's path-count MatMul)
    assert _threshold_readers(_compare_after_matmul("Equal", vector)) == {}
    # a scalar, or a vector of one value repeated, is a gate: what it compares is left alone
    for gate in (np.array(0.5, np.float32), np.full(3, 0.5, np.float32)):
        assert _threshold_readers(_compare_after_matmul("Greater", gate)) == {}
        by_node = {d.node: d for d in convert(_compare_after_matmul("Greater", gate), probe=False).decisions}
        assert (by_node["proj"].precision, by_node["proj"].rule) == ("fp16", "policy.low")
    # two computed operands compare no thresholds either
    m = _compare_after_matmul("Less", vector)
    m.graph.node[2].input[1] = "x"
    assert _threshold_readers(m) == {}


def test_a_leaky_relu_written_as_where_keeps_its_matmul_fp16():
    """Where(h > 0, h, 0.01 * h) after a MatMul: the gate is continuous at 0, so a value FP16 rounds across it
    moves nothing, and the MatMul (the model's FLOPs) stays FP16 at the same error as a LeakyRelu op."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="proj"),
             helper.make_node("Greater", ["h", "zero"], ["pos"], name="gate"),
             helper.make_node("Mul", ["h", "slope"], ["hs"], name="leak"),
             helper.make_node("Where", ["pos", "h", "hs"], ["y"], name="where")]
    rng = np.random.default_rng(0)
    inits = [tensor("w", (rng.normal(size=(64, 64)) / 8).astype(np.float32)), tensor("zero", np.array(0, np.float32)),
             tensor("slope", np.array(0.01, np.float32))]
    m = make_model(nodes, [vi("x", F32, ["N", 64])], [vi("y", F32, ["N", 64])], inits, opset=17, ir_version=8)
    result = convert(m, probe=False)
    by_node = {d.node: d for d in result.decisions}
    assert (by_node["proj"].precision, by_node["proj"].rule) == ("fp16", "policy.low")
    assert not any(d.rule == "threshold.input" for d in result.decisions)
    x = rng.normal(size=(256, 64)).astype(np.float32)
    (want,), (got,) = (run_onnxruntime(mm, {"x": x}) for mm in (m, emulate(result.model)))
    assert np.max(np.abs(got - want)) / np.ptp(want) < 1e-3
