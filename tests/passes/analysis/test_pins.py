"""The pass that applies --tolerance's choices: pinned nodes FIXED at FP32 without spreading FP32 to
their neighbours, nodes it keeps low ALLOW, user blocks first, and its checks."""

from __future__ import annotations

import pytest
from onnx import helper
from onnx_ir.passes import PreconditionError

from amp_compiler import convert
from tests.support.onnx_builders import model, tensor, vi, weights


def _chain():
    """x -> mm0 -> bias (Add) -> tanh -> mm1 -> y: a Tensor Core op, two cheap ops, a Tensor Core op."""
    nodes = [
        helper.make_node("MatMul", ["x", "w0"], ["h0"], name="mm0"),
        helper.make_node("Add", ["h0", "b0"], ["h1"], name="bias"),
        helper.make_node("Tanh", ["h1"], ["h2"], name="tanh"),
        helper.make_node("MatMul", ["h2", "w1"], ["y"], name="mm1"),
    ]
    inits = [tensor("w0", weights([32, 32], 1)), tensor("b0", weights([32], 2)), tensor("w1", weights([32, 32], 3))]
    return model(nodes, [vi("x", shape=[8, 32])], [vi("y", shape=[8, 32])], inits)


def _decided(result):
    return {d.node: (d.precision, d.rule) for d in result.decisions if d.index is not None}


def test_a_pinned_tensor_core_op_stays_fp32_without_taking_its_followers_along():
    got = _decided(convert(_chain(), pinned_nodes=[(0, "pinned by a test")], probe=False))
    assert got["mm0"] == ("fp32", "tolerance.pinned")
    # a hazard (DENY) would spread FP32 forward to bias and tanh; a pin leaves them to placement
    assert got["bias"][1] != "paint.deny-forward" and got["tanh"][1] != "paint.deny-forward"
    assert got["mm1"] == ("fp16", "policy.low")


def test_kept_nodes_stay_low_between_pinned_ones():
    pins = [(0, "pinned"), (3, "pinned")]
    plain = _decided(convert(_chain(), pinned_nodes=pins, probe=False))
    assert plain["bias"][0] == plain["tanh"][0] == "fp32"  # between two FP32 ops, painting keeps them FP32
    got = _decided(convert(_chain(), pinned_nodes=pins, kept_nodes=[(1, "kept"), (2, "kept")], probe=False))
    assert got["bias"] == got["tanh"] == ("fp16", "tolerance.kept-low")
    assert got["mm0"][0] == got["mm1"][0] == "fp32"


def test_reasons_come_from_the_refinement():
    result = convert(_chain(), pinned_nodes=[(0, "pinned by --tolerance 0.001: a reason")], kept_nodes=[(1, "why")], probe=False)
    by_node = {d.node: d for d in result.decisions}
    assert by_node["mm0"].reason == "FP32: pinned by --tolerance 0.001: a reason"
    assert by_node["bias"].reason == "low precision: why"


def test_user_blocks_win_over_the_refinement():
    got = _decided(convert(_chain(), block_nodes=["^bias$"], kept_nodes=[(1, "kept")], probe=False))
    assert got["bias"] == ("fp32", "user.block-node")


def test_a_node_both_pinned_and_kept_is_refused():
    # the test suite runs every pass's checks (AMP_COMPILER_CHECK_PASSES=1, tests/conftest.py)
    with pytest.raises(PreconditionError, match="both pinned and kept"):
        convert(_chain(), pinned_nodes=[(1, "a")], kept_nodes=[(1, "b")], probe=False)
