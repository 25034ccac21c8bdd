"""Painting (passes/paint.py: TensorFlow's AMP painting): each step on a graph where the answer is known."""

import pytest
from onnx import TensorProto, helper

from amp_compiler import convert
from amp_compiler.errors import OptionError
from tests.support.onnx_builders import F32, TEST_POLICY, model, tensor, vi, weights


def _decide(m, **kw):
    r = convert(m, policy=TEST_POLICY, probe=False, **kw)
    return r, {d.node: d for d in r.decisions}


def _chain(ops, opset=18):
    """x -> op0 -> op1 -> ... -> y, MatMuls taking a square weight."""
    nodes, inits, prev = [], [], "x"
    for i, op in enumerate(ops):
        out = "y" if i == len(ops) - 1 else f"t{i}"
        if op == "MatMul":
            inits.append(tensor(f"w{i}", weights((4, 4), seed=i)))
            nodes.append(helper.make_node(op, [prev, f"w{i}"], [out], name=f"{op.lower()}{i}"))
        elif op in ("Add", "Mul"):
            inits.append(tensor(f"c{i}", weights((4,), seed=i)))
            nodes.append(helper.make_node(op, [prev, f"c{i}"], [out], name=f"{op.lower()}{i}"))
        else:
            nodes.append(helper.make_node(op, [prev], [out], name=f"{op.lower()}{i}"))
        prev = out
    return model(nodes, [vi("x", F32, [2, 4])], [vi("y", F32, [2, 4])], inits, opset=opset)


def test_low_ops_start_low_and_high_ops_stay_fp32():
    _, d = _decide(_chain(["MatMul", "Exp", "MatMul"]))
    assert d["matmul0"].precision == "fp16" and d["matmul0"].rule == "policy.low"
    assert d["exp1"].precision == "fp32" and d["exp1"].rule == "policy.high.range"


def test_deny_spreads_forward_through_follow_ops_until_a_low_op():
    _, d = _decide(_chain(["MatMul", "Exp", "Add", "Mul", "MatMul"]))
    assert d["add2"].precision == d["mul3"].precision == "fp32"
    assert d["add2"].rule == "paint.deny-forward"
    assert "Exp" in d["add2"].reason
    assert d["matmul4"].precision == "fp16"


def test_follow_ops_between_low_ops_become_low():
    _, d = _decide(_chain(["MatMul", "Add", "Tanh", "MatMul"]))
    assert d["add1"].precision == d["tanh2"].precision == "fp16"
    assert d["add1"].rule == "paint.between-low"


def test_follow_op_without_low_consumer_stays_fp32():
    _, d = _decide(_chain(["MatMul", "Add"]))
    assert d["add1"].precision == "fp32" and d["add1"].rule == "paint.default-fp32"


def test_low_spreads_through_pass_ops_both_ways():
    r, d = _decide(_chain(["Relu", "MatMul", "Relu"]))
    assert d["relu0"].precision == d["relu2"].precision == "fp16"
    assert d["relu0"].rule == "paint.pass-spread"


def test_deny_does_not_spread_into_pass_ops_that_lead_only_to_low_ops():
    # Exp -> Relu -> MatMul: the Relu leads to no deny/follow op, so it joins the MatMul.
    _, d = _decide(_chain(["Exp", "Relu", "MatMul"]))
    assert d["relu1"].precision == "fp16"


@pytest.mark.parametrize("provider, expected", [("cuda", "fp16"), ("cpu", "fp32")])
def test_arithmetic_high_op_follows_where_the_provider_accumulates_in_fp32(provider, expected):
    _, d = _decide(_chain(["MatMul", "Softmax", "MatMul"]), provider=provider)
    assert d["softmax1"].precision == expected
    if provider == "cuda":
        assert d["softmax1"].rule == "paint.between-low"
        # the reason names the kernel's source, as the policy table gives it for the provider
        source = TEST_POLICY.get("", "Softmax").fp32_inside["cuda"]
        assert d["softmax1"].reason == f"HIGH op whose kernel computes in FP32 inside ({source}): between low-precision ops"
    else:
        assert d["softmax1"].rule == "policy.high.arithmetic"


def test_constant_fed_ops_count_as_low_ancestors():
    # Embedding lookups: Gather(table) + Gather(positions) -> Add -> MatMul needs no Cast at all.
    table = weights((10, 4), seed=1)
    pos = weights((10, 4), seed=2)
    m = model(
        [
            helper.make_node("Gather", ["table", "ids"], ["e"], name="tok"),
            helper.make_node("Gather", ["pos", "ids"], ["p"], name="pos_emb"),
            helper.make_node("Add", ["e", "p"], ["s"], name="add"),
            helper.make_node("MatMul", ["s", "w"], ["y"], name="mm"),
        ],
        [vi("ids", TensorProto.INT64, [3])], [vi("y", F32, [3, 4])],
        [tensor("table", table), tensor("pos", pos), tensor("w", weights((4, 4)))],
    )
    r, d = _decide(m)
    assert {d[n].precision for n in ("tok", "pos_emb", "add", "mm")} == {"fp16"}
    casts = [n for n in r.model.graph.node if n.op_type == "Cast"]
    assert len(casts) == 1  # only the graph output goes back to fp32
    inits = {i.name: i.data_type for i in r.model.graph.initializer}
    assert inits == {"table": TensorProto.FLOAT16, "pos": TensorProto.FLOAT16, "w": TensorProto.FLOAT16}


def test_user_blocks_take_precedence_over_the_policy():
    m = _chain(["MatMul", "Add", "MatMul"])
    _, d = _decide(m, block_ops=["MatMul"])
    assert d["matmul0"].precision == "fp32" and d["matmul0"].rule == "user.block-op"
    _, d = _decide(m, block_nodes=["^matmul2$"])
    assert d["matmul2"].rule == "user.block-node" and d["matmul0"].precision == "fp16"
    assert d["add1"].precision == "fp32"  # no longer between two low ops


def test_unknown_block_op_and_bad_pattern_are_option_errors():
    m = _chain(["MatMul"])
    with pytest.raises(OptionError, match="NotAnOp") as bad_op:
        convert(m, policy=TEST_POLICY, block_ops=["NotAnOp"], probe=False)
    with pytest.raises(OptionError, match="regular expression") as bad_pattern:
        convert(m, policy=TEST_POLICY, block_nodes=["(unclosed"], probe=False)
    with pytest.raises(OptionError, match="fp4") as bad_target:
        convert(m, policy=TEST_POLICY, target="fp4", probe=False)
    # Library errors name the API keyword they are about, and no command-line flag.
    errors = (bad_op.value, bad_pattern.value, bad_target.value)
    assert [e.option for e in errors] == ["block_ops", "block_nodes", "target"]
    assert not any("--" in str(e) for e in errors)


def test_bf16_target_paints_the_same_way():
    _, d = _decide(_chain(["MatMul", "Add", "MatMul", "Exp"]), target="bf16")
    assert [d[n].precision for n in ("matmul0", "add1", "matmul2", "exp3")] == ["bf16", "bf16", "bf16", "fp32"]
