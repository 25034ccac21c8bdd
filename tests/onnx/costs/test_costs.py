"""What a Tensor Core op's product is, for its FLOPs and its Tensor Core dims, is read from the policy table.

The table's ``gemm`` layout of an op (matmul, conv, conv_transpose, einsum, recurrent; its operands,
transposes and bias) is the one place that says so: the cost model, padding and the FX path's FLOPs
read it, and an op the table does not lay out is costed as any other numeric op.
"""

from __future__ import annotations

import dataclasses

import onnx
from onnx import helper

from amp_compiler.onnx.costs.costs import estimate
from amp_compiler.policy import OpPolicy, PolicyTable, default_table
from tests.support.onnx_builders import vi

F16 = onnx.TensorProto.FLOAT16


def _model(op: str, domain: str = "", **attrs) -> onnx.ModelProto:
    node = helper.make_node(op, ["a", "b"], ["y"], domain=domain, **attrs)
    graph = helper.make_graph([node], "g", [vi("a", F16, [6, 16]), vi("b", F16, [16, 24])], [vi("y", F16, [6, 24])])
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    return helper.make_model(graph, opset_imports=opsets)


def _without_layout(op: str) -> PolicyTable:
    return PolicyTable([dataclasses.replace(e, gemm=None) if e.op == op else e for e in default_table()])


def test_a_matmul_is_costed_from_its_layout_in_the_table():
    (cost,) = estimate(_model("MatMul")).nodes
    assert cost.flops == 2 * 6 * 24 * 16
    assert cost.tensor_core is True and cost.tensor_core_note == "K=16, N=24"


def test_without_its_layout_a_tensor_core_op_is_costed_per_output_element():
    (cost,) = estimate(_model("MatMul"), policy=_without_layout("MatMul")).nodes
    assert cost.flops == 6 * 24
    assert cost.tensor_core is None and cost.tensor_core_note == "the GEMM dims of MatMul are not checked"


def test_an_op_the_table_lays_out_as_a_matmul_is_costed_as_one_whatever_its_name():
    matmul = default_table().get("", "MatMul")
    assert matmul is not None
    mine = OpPolicy("MyProduct", "example.ops", matmul.category, "a matrix product", tensor_core=True, gemm=matmul.gemm)
    table = PolicyTable([*default_table(), mine])
    (cost,) = estimate(_model("MyProduct", "example.ops"), policy=table).nodes
    assert cost.flops == 2 * 6 * 24 * 16
    # a MatMul of another domain is not the ONNX MatMul: its output elements, as any other op's
    (cost,) = estimate(_model("MatMul", "example.ops"), policy=table).nodes
    assert cost.flops == 6 * 24 and cost.tensor_core is None


def test_a_matmul_whose_operand_shape_is_unknown_is_not_assessed():
    node = helper.make_node("MatMul", ["a", "b"], ["y"])
    graph = helper.make_graph([node], "g", [vi("a", F16, None), vi("b", F16, [16, 24])], [vi("y", F16, None)])
    (cost,) = estimate(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])).nodes
    assert cost.tensor_core is None and cost.tensor_core_note == "shapes unknown"
