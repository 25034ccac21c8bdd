"""Ops that read only a shape (Shape, Size: the policy's ``shape_inputs``) take any float type and
never get a Cast of their own; and the summary's Cast count is the Casts inserted.

Before, Shape's input was a vertex of its own fixed at FP32 (Shape is never touched), so every float
tensor whose shape the graph read (attention reshapes, the exporters' dynamic-shape code) got a Cast
back to FP32 just for it: 24 of 26 Casts on a TorchScript GPT-2 export.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from amp_compiler import convert
from amp_compiler.onnx.measure.checks import run_onnxruntime, validate
from amp_compiler.policy import default_table
from tests.support.onnx_builders import F32, model, tensor, vi, weights

I64 = onnx.TensorProto.INT64


def _reshape_by_own_shape(op: str = "Shape") -> onnx.ModelProto:
    """x -> MatMul -> h; Reshape(h) to a shape computed from h's (Shape, or Size / 8 rows of 8) ->
    MatMul -> y: h is FP16, and the shape reader reads it as it is."""
    shape_nodes = (
        [helper.make_node("Shape", ["h"], ["s"], name="shape")] if op == "Shape" else
        [helper.make_node("Size", ["h"], ["n"], name="size"),
         helper.make_node("Reshape", ["n", "one"], ["n1"], name="as_1d"),
         helper.make_node("Div", ["n1", "width"], ["rows"], name="div"),
         helper.make_node("Concat", ["rows", "width"], ["s1"], name="concat", axis=0)]
    )
    target = "s" if op == "Shape" else "s1"
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
        *shape_nodes,
        helper.make_node("Reshape", ["h", target], ["r"], name="reshape"),
        helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2"),
    ]
    inits = [tensor("w1", weights((16, 8))), tensor("w2", weights((8, 8), 1))]  # K = 16 (raw-small-product)
    if op == "Size":
        inits += [tensor("one", np.array([1], np.int64)), tensor("width", np.array([8], np.int64))]
    return model(nodes, [vi("x", F32, [4, 16])], [vi("y", F32, [4, 8])], inits)


@pytest.mark.parametrize("op", ["Shape", "Size"])
def test_no_cast_for_a_shape_reader(op: str) -> None:
    m = _reshape_by_own_shape(op)
    result = convert(m, probe=False)
    reader = next(d for d in result.decisions if d.op_type == op)
    assert reader.rule == "nonfloat.shape-only" and reader.input_dtypes == ["fp16"]
    casts = [d for d in result.decisions if d.rule == "lowering.cast"]
    # Only the graph input and output (kept FP32) need one: nothing for the shape reader.
    assert len(casts) == 2 and result.casts_inserted == 2
    validate(result.model)
    x = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)
    np.testing.assert_allclose(run_onnxruntime(result.model, {"x": x})[0], run_onnxruntime(m, {"x": x})[0], atol=0.02)


def test_shape_inputs_are_in_the_policy_table() -> None:
    table = default_table()
    assert table.get("", "Shape").shape_inputs == {0} and table.get("", "Size").shape_inputs == {0}
    assert all(not e.shape_inputs or e.op in ("Shape", "Size") for e in table)


def test_casts_inserted_counts_inserted_not_the_net_change() -> None:
    """An exporter's Cast the conversion makes unnecessary is removed: the summary counts it apart,
    instead of subtracting it from the Casts inserted."""
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
        helper.make_node("Cast", ["h"], ["hc"], name="exporter_cast", to=onnx.TensorProto.FLOAT16),
        helper.make_node("Cast", ["hc"], ["h32"], name="exporter_back", to=F32),
        helper.make_node("MatMul", ["h32", "w2"], ["y"], name="mm2"),
    ]
    m = model(nodes, [vi("x", F32, [4, 16])], [vi("y", F32, [4, 8])],
              [tensor("w1", weights((16, 8))), tensor("w2", weights((8, 8), 1))])
    result = convert(m, probe=False)
    inserted = sum(d.rule == "lowering.cast" for d in result.decisions)
    assert result.casts_inserted == inserted == 2
    assert result.casts_removed == 2
    assert len(result.decisions) == len(m.graph.node) + result.casts_inserted - result.casts_removed
