"""Nodes out of topological order are sorted (amp_compiler.onnx.load.node_order): onnxruntime loads such
graphs, and its own float16 converter writes them; a cycle or an undefined tensor is left to the checker."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from amp_compiler import convert
from amp_compiler.onnx.load.node_order import in_topological_order
from amp_compiler.onnx.measure.checks import run_onnxruntime
from tests.support.onnx_builders import F32, vi, weights
from tests.support.onnx_builders import model as make_model


def _graph(nodes, inputs, outputs, inits=()):
    return helper.make_graph(list(nodes), "g", list(inputs), list(outputs), list(inits))


def _unchecked(nodes, inputs, outputs, inits=()) -> onnx.ModelProto:
    """A model of ``nodes`` as they are (onnx's checker would refuse their order)."""
    return helper.make_model(_graph(nodes, inputs, outputs, inits), opset_imports=[helper.make_opsetid("", 17)])


def test_a_sorted_model_is_returned_as_it_is():
    m = make_model([helper.make_node("Neg", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["y"])],
                   [vi("x", shape=[2])], [vi("y", shape=[2])])
    assert in_topological_order(m) == (m, "")


def test_the_order_is_stable_and_subgraphs_are_sorted_too():
    then = _graph([helper.make_node("Relu", ["t"], ["out"]), helper.make_node("Neg", ["a"], ["t"])], [],
                  [vi("out", shape=[2])])
    other = _graph([helper.make_node("Identity", ["a"], ["out2"])], [], [vi("out2", shape=[2])])
    nodes = [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other, name="if"),
             helper.make_node("Abs", ["x"], ["a"], name="abs"), helper.make_node("Exp", ["x"], ["e"], name="exp"),
             helper.make_node("Less", ["e", "one"], ["c"], name="less")]
    m = helper.make_model(_graph(nodes, [vi("x", shape=[2])], [vi("y", shape=[2])],
                                 [onnx.numpy_helper.from_array(np.ones(1, np.float32), "one")]),
                          opset_imports=[helper.make_opsetid("", 17)])
    fixed, note = in_topological_order(m)
    assert note == "nodes sorted into topological order in 2 of its graphs (onnx requires it; nothing they compute changed)"
    assert [n.name for n in fixed.graph.node] == ["abs", "exp", "less", "if"]
    branch = next(a.g for a in fixed.graph.node[3].attribute if a.name == "then_branch")
    assert [n.op_type for n in branch.node] == ["Neg", "Relu"]
    assert [n.name for n in m.graph.node] == ["if", "abs", "exp", "less"]  # the caller's model is untouched
    onnx.checker.check_model(fixed, full_check=True)


def test_a_cycle_or_an_undefined_tensor_is_left_for_the_checker():
    cycle = _unchecked([helper.make_node("Add", ["x", "b"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
                        helper.make_node("Identity", ["a"], ["y"])], [vi("x", shape=[2])], [vi("y", shape=[2])])
    assert in_topological_order(cycle) == (cycle, "")
    ghost = _unchecked([helper.make_node("Relu", ["a"], ["y"]), helper.make_node("Add", ["x", "ghost"], ["a"])],
                       [vi("x", shape=[2])], [vi("y", shape=[2])])
    assert in_topological_order(ghost) == (ghost, "")


def test_convert_sorts_what_onnxruntimes_float16_converter_writes():
    """Its Casts come after their consumers (sweep Z): refused as invalid before."""
    nodes = [helper.make_node("MatMul", ["x16", "w"], ["y16"], name="mm"),
             helper.make_node("Cast", ["y16"], ["y"], to=onnx.TensorProto.FLOAT),
             helper.make_node("Cast", ["x"], ["x16"], to=onnx.TensorProto.FLOAT16)]
    w = onnx.numpy_helper.from_array(weights((8, 8)).astype(np.float16), "w")
    unsorted = _unchecked(nodes, [vi("x", F32, [2, 8])], [vi("y", F32, [2, 8])], [w])
    result = convert(unsorted)
    assert result.node_order.startswith("nodes sorted into topological order")
    feeds = {"x": np.ones((2, 8), np.float32)}
    sorted_in, _ = in_topological_order(unsorted)
    np.testing.assert_array_equal(run_onnxruntime(result.model, feeds)[0], run_onnxruntime(sorted_in, feeds)[0])
