"""Units of --tolerance: every low-precision node in exactly one unit, rooted at a Tensor Core op or
at a low-precision node no low-precision node feeds; the rest join their nearest producer's unit."""

from __future__ import annotations

from onnx import helper

from amp_compiler.onnx.tolerance.units import partition
from tests.support.onnx_builders import model, tensor, vi, weights


def _residual_block():
    """x -> scale (Mul) -> mm0 -> bias0 -> act0 -> mm1 -> bias1 -> residual(act0, bias1) -> act2 -> y"""
    nodes = [
        helper.make_node("Mul", ["x", "s"], ["xs"], name="scale"),
        helper.make_node("MatMul", ["xs", "w0"], ["h0"], name="mm0"),
        helper.make_node("Add", ["h0", "b0"], ["h1"], name="bias0"),
        helper.make_node("Relu", ["h1"], ["a0"], name="act0"),
        helper.make_node("MatMul", ["a0", "w1"], ["h2"], name="mm1"),
        helper.make_node("Add", ["h2", "b1"], ["h3"], name="bias1"),
        helper.make_node("Add", ["a0", "h3"], ["h4"], name="residual"),
        helper.make_node("Relu", ["h4"], ["y"], name="act2"),
    ]
    inits = [tensor("s", weights([16], 1)), tensor("w0", weights([16, 16], 2)), tensor("b0", weights([16], 3)),
             tensor("w1", weights([16, 16], 4)), tensor("b1", weights([16], 5))]
    return model(nodes, [vi("x", shape=[4, 16])], [vi("y", shape=[4, 16])], inits)


_TC = [False, True, False, False, True, False, False, False]
_FLOPS = [64, 2048, 64, 64, 2048, 64, 64, 64]


def test_each_tensor_core_op_roots_a_unit_with_the_cheap_ops_it_feeds():
    m = _residual_block()
    units = partition(m.graph, set(range(8)), _TC, _FLOPS)
    assert [u.nodes for u in units] == [(0,), (1, 2, 3), (4, 5, 6, 7)]
    assert [u.root for u in units] == [0, 1, 4]
    assert [u.tensor_core_flops for u in units] == [0, 2048, 2048]  # a cheap root costs no Tensor Core FLOPs


def test_a_node_joins_its_nearest_producer_not_the_first():
    m = _residual_block()
    # residual reads act0 (two cheap nodes from mm0) and bias1 (one from mm1): it joins mm1's unit
    units = partition(m.graph, set(range(8)), _TC, _FLOPS)
    assert next(u for u in units if 6 in u.nodes).root == 4


def test_fp32_nodes_are_in_no_unit_and_cut_what_follows_them_loose():
    m = _residual_block()
    low = set(range(8)) - {3}  # act0 stays FP32: mm1 still roots a unit, bias0 stays with mm0
    units = partition(m.graph, low, _TC, _FLOPS)
    assert sorted(i for u in units for i in u.nodes) == sorted(low)
    assert [u.nodes for u in units] == [(0,), (1, 2), (4, 5, 6, 7)]
    low = {5, 6, 7}  # nothing low feeds bias1: it roots a cheap unit of its own
    assert [(u.nodes, u.tensor_core_flops) for u in partition(m.graph, low, _TC, _FLOPS)] == [((5, 6, 7), 0)]
