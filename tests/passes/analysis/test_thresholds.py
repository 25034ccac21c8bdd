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
    x -> MatMul "side" -> y2, read by no threshold op."""
    tree = helper.make_node(
        "TreeEnsembleRegressor", ["f"], ["y"], domain="ai.onnx.ml", name="tree", n_targets=1,
        nodes_treeids=[0, 0, 0], nodes_nodeids=[0, 1, 2], nodes_featureids=[0, 0, 0], nodes_values=[1000.3, 0.0, 0.0],
        nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"], nodes_truenodeids=[1, 0, 0], nodes_falsenodeids=[2, 0, 0],
        target_treeids=[0, 0], target_nodeids=[1, 2], target_ids=[0, 0], target_weights=[-1.0, 1.0])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["z"], name="proj"),
             helper.make_node("Reshape", ["z", "shape"], ["f"], name="flat"), tree,
             helper.make_node("MatMul", ["x", "w2"], ["y2"], name="side")]
    inits = [tensor("w", np.ones((1, 1), np.float32)), tensor("shape", np.array([-1, 1], np.int64)),
             tensor("w2", np.ones((1, 16), np.float32))]
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
