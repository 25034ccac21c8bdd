"""The written model declares the shapes the input declared: the conversion changes element types only."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from amp_compiler import convert
from amp_compiler.onnx.measure.emulate import emulate
from tests.support.onnx_builders import F32, model, tensor, vi, weights


def _branches_model() -> onnx.ModelProto:
    """If(cond): then an empty [0, 4] Constant (a merged decoder's placeholder for a cache it does not
    compute), else x @ w; both branches declare their output ``[n, 4]``, as Optimum's merged decoders do."""
    then = helper.make_graph(
        [helper.make_node("Constant", [], ["empty"], name="placeholder",
                          value=helper.make_tensor("e", TensorProto.FLOAT, [0, 4], []))],
        "then", [], [vi("empty", F32, ["n", 4])])
    other = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["product"], name="mm")], "else", [],
                              [vi("product", F32, ["n", 4])])
    return model(
        [helper.make_node("If", ["cond"], ["y"], name="branch", then_branch=then, else_branch=other)],
        [vi("cond", TensorProto.BOOL, []), vi("x", F32, ["n", 16])], [vi("y", F32, ["n", 4])],
        [tensor("w", weights((16, 4)))],  # K = 16: a shorter product of x is policy.high.raw-small-product's
    )


def _branch_output_dims(m: onnx.ModelProto) -> list[list]:
    (node,) = [n for n in m.graph.node if n.op_type == "If"]
    return [[d.dim_param or d.dim_value for d in a.g.output[0].type.tensor_type.shape.dim] for a in node.attribute]


def test_subgraph_outputs_keep_their_declared_shapes_and_the_model_runs_at_any_size():
    """Before: shape inference's [0, 4] (the Constant's) replaced the then branch's declared [n, 4] in the
    written model. An Optimum T5 merged decoder's else branch was made [1, 4, 4, 16] the same way, and
    onnxruntime, which allocates an If's outputs as the branch declares them, refused its first step."""
    fp32 = _branches_model()
    converted = convert(fp32, probe=False).model
    assert _branch_output_dims(converted) == [["n", 4], ["n", 4]]
    (branch,) = [n for n in converted.graph.node if n.op_type == "If"]
    assert any(n.op_type == "MatMul" and n.input[0].endswith("fp16") for a in branch.attribute for n in a.g.node)
    session = ort.InferenceSession(emulate(converted).SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
    (y,) = session.run(None, {"cond": np.array(False), "x": x})
    assert y.shape == (3, 4) and np.allclose(y, x @ onnx.numpy_helper.to_array(fp32.graph.initializer[0]), atol=1e-2)
    (empty,) = session.run(None, {"cond": np.array(True), "x": x})
    assert empty.shape == (0, 4)


def test_a_subgraph_output_declared_without_a_shape_is_written_without_one():
    fp32 = _branches_model()
    for attr in fp32.graph.node[0].attribute:
        attr.g.output[0].type.tensor_type.ClearField("shape")
    converted = convert(fp32, probe=False).model
    (branch,) = [n for n in converted.graph.node if n.op_type == "If"]
    assert all(not a.g.output[0].type.tensor_type.HasField("shape") for a in branch.attribute)
    assert len({a.g.output[0].type.tensor_type.elem_type for a in branch.attribute}) == 1  # both branches alike
