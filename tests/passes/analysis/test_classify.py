"""The user's overrides in classification: ``--allow-op``/``--allow-node`` (rule ``user.allow``) against the
policy, the block options, the passes after classification, and dtypes fixed by the schema or the model.

Precedence (passes/analysis/classify.py): fixed > block_nodes > allow_nodes > block_ops > allow_ops > the
policy; a forced node still stays FP32 where low precision cannot run (no kernel on the provider) or cannot
hold its values (constants, stated or observed ranges beyond the target's); judgements (signal paths,
quantized islands, --tolerance, painting, placement) leave it low.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from amp_compiler import convert
from amp_compiler.core.decision import allow_message
from amp_compiler.core.measures import TensorRange
from amp_compiler.core.plan import Role, Rule
from amp_compiler.errors import OptionError
from amp_compiler.passes.analysis import UserChoices, compile_patterns
from amp_compiler.runtime.runner import InProcessRunner
from tests.support.onnx_builders import F32, model, tensor, vi, weights


def _decisions(result):
    return {d.node: d for d in result.decisions}


def _exp_model():
    """x -> MatMul -> Exp -> MatMul -> y: Exp is HIGH (range-sensitive), FP32 by the policy."""
    return model(
        [
            helper.make_node("MatMul", ["x", "w1"], ["a"], name="mm1"),
            helper.make_node("Exp", ["a"], ["e"], name="block0/exp"),
            helper.make_node("MatMul", ["e", "w2"], ["y"], name="mm2"),
        ],
        [vi("x", F32, [2, 8])], [vi("y", F32, [2, 8])],
        [tensor("w1", weights((8, 8), seed=1)), tensor("w2", weights((8, 8), seed=2))],
    )


def test_an_allowed_op_goes_low_against_the_policy_with_its_own_rule_and_reason():
    plain = _decisions(convert(_exp_model(), probe=False))
    assert plain["block0/exp"].precision == "fp32" and plain["block0/exp"].rule == "policy.high.range"
    result = convert(_exp_model(), allow_ops=["Exp"], probe=False)
    d = _decisions(result)["block0/exp"]
    assert (d.precision, d.rule) == ("fp16", "user.allow")
    assert d.reason.startswith("FP16: forced low, user --allow-op Exp (without it: HIGH: Exp is range-sensitive")
    assert d.input_dtypes == ["fp16"] and d.output_dtypes == ["fp16"]
    assert not [n for n in result.model.graph.node if n.op_type == "Cast" and n.name.startswith("block0")]
    assert allow_message(result.decisions, result.allowed, "fp16") == (
        "--allow-op/--allow-node forced 1 node(s) into fp16 whatever the policy says ('block0/exp')"
    )


def test_an_allowed_node_name_goes_low_in_bf16_too():
    d = _decisions(convert(_exp_model(), target="bf16", allow_nodes=[r"^block0/"], probe=False))["block0/exp"]
    assert (d.precision, d.rule) == ("bf16", "user.allow")
    assert "node name matches --allow-node '^block0/'" in d.reason


@pytest.mark.parametrize(
    "options, rule",
    [
        ({"allow_nodes": ["exp"], "block_nodes": ["block0"]}, "user.block-node"),  # block-node beats allow-node
        ({"allow_nodes": ["exp"], "block_ops": ["Exp"]}, "user.allow"),  # allow-node beats block-op
        ({"allow_ops": ["Exp"], "block_nodes": ["exp"]}, "user.block-node"),  # block-node beats allow-op
        ({"allow_ops": ["Exp", "MatMul"], "block_ops": ["Relu"]}, "user.allow"),
    ],
)
def test_precedence_between_the_block_and_allow_options(options, rule):
    d = _decisions(convert(_exp_model(), probe=False, **options))["block0/exp"]
    assert d.rule == rule and d.precision == ("fp16" if rule == "user.allow" else "fp32")


def test_the_same_op_blocked_and_allowed_is_refused():
    with pytest.raises(OptionError, match="Exp: blocked too") as caught:
        convert(_exp_model(), allow_ops=["Exp"], block_ops=["Exp"], probe=False)
    assert caught.value.option == "allow_ops"


@pytest.mark.parametrize(
    "options, option, needle",
    [({"allow_ops": ["NotAnOp"]}, "allow_ops", "unknown op type(s): NotAnOp"),
     ({"allow_nodes": ["("]}, "allow_nodes", "invalid regular expression '('")],
)
def test_bad_allow_options_name_their_keyword(options, option, needle):
    with pytest.raises(OptionError) as caught:
        convert(_exp_model(), probe=False, **options)
    assert caught.value.option == option and needle in str(caught.value)


def test_user_choices_state_the_precedence():
    choices = UserChoices(
        block_ops=frozenset({"Softmax"}), block_nodes=compile_patterns(["lm_head"]),
        allow_ops=frozenset({"Exp", "MatMul"}), allow_nodes=compile_patterns(["attn"], option="allow_nodes"),
    )
    assert choices.choice("MatMul", "lm_head").rule is Rule.USER_BLOCK_NODE
    assert choices.choice("Softmax", "attn/softmax").rule is Rule.USER_ALLOW
    assert choices.choice("Softmax", "mlp/softmax").rule is Rule.USER_BLOCK_OP
    assert choices.choice("Exp", "mlp/exp").role is Role.ALLOW and not choices.choice("Exp", "x").by_name
    assert choices.choice("Relu", "mlp/relu") is None
    assert choices.allows("MatMul", "mm") and not choices.allows("MatMul", "lm_head")


# ------------------------------------------------------------------ what wins over a forced node


def test_a_dtype_fixed_by_the_model_wins():
    """An op the model computes in FP64 keeps its type: only FP32 is converted."""
    m = model(
        [helper.make_node("Cast", ["x"], ["d"], name="to64", to=TensorProto.DOUBLE),
         helper.make_node("Exp", ["d"], ["e64"], name="exp64"),
         helper.make_node("Cast", ["e64"], ["e"], name="to32", to=F32),
         helper.make_node("Exp", ["e"], ["y"], name="exp")],
        [vi("x", F32, [2, 4])], [vi("y", F32, [2, 4])],
    )
    result = convert(m, allow_ops=["Exp"], keep_io_types=False, probe=False)
    d = _decisions(result)
    assert (d["exp64"].rule, d["exp64"].precision) == ("fixed", "fp64")
    assert (d["exp"].rule, d["exp"].precision) == ("user.allow", "fp16")
    assert allow_message(result.decisions, result.allowed, "fp16").endswith(
        "('exp'); 1 kept out of fp16 all the same ('exp64': fixed)")


def test_a_dtype_fixed_by_keep_io_types_wins():
    """The graph output keeps FP32: the forced node computes low and a Cast gives the output its type."""
    result = convert(_exp_model(), allow_ops=["Exp"], keep_io_types=["y"], probe=False)
    assert result.model.graph.output[0].type.tensor_type.elem_type == F32
    assert _decisions(result)["block0/exp"].precision == "fp16"


def test_no_kernel_on_the_provider_wins(snapshot_only):
    """GridSample has no FP16 CUDA kernel: forced low, onnxruntime would run it on the CPU with copies."""
    rng = np.random.default_rng(0)
    m = model(
        [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
         helper.make_node("GridSample", ["c1", "grid"], ["y"], name="gs")],
        [vi("x", F32, [1, 8, 6, 6])], [vi("y", F32, [1, 8, 4, 4])],
        [tensor("w1", weights((8, 8, 3, 3), seed=1)),
         tensor("grid", rng.uniform(-1, 1, (1, 4, 4, 2)).astype(np.float32))],
        opset=19,
    )
    result = convert(m, provider="cuda", allow_ops=["GridSample"], probe=False)
    d = _decisions(result)["gs"]
    assert (d.precision, d.rule) == ("fp32", "provider.no-kernel")
    assert "1 kept out of fp16 all the same ('gs': provider.no-kernel)" in allow_message(
        result.decisions, result.allowed, "fp16")
    # on the CPU provider nothing is pinned (onnxruntime casts around it itself): the allow holds
    assert _decisions(convert(m, provider="cpu", allow_ops=["GridSample"], probe=False))["gs"].rule == "user.allow"


def test_a_constant_the_target_cannot_hold_wins():
    """Add(x, 1e6): 1e6 is infinite in FP16; forced low, the node would compute with inf."""
    m = model(
        [helper.make_node("Add", ["x", "big"], ["a"], name="add_big"),
         helper.make_node("Add", ["x", "one"], ["b"], name="add_one"),
         helper.make_node("Mul", ["a", "b"], ["y"], name="mul")],
        [vi("x", F32, [2, 4])], [vi("y", F32, [2, 4])],
        [tensor("big", np.full((4,), 1e6, np.float32)), tensor("one", np.ones((4,), np.float32))],
    )
    d = _decisions(convert(m, allow_ops=["Add"], probe=False))
    assert (d["add_big"].precision, d["add_big"].rule) == ("fp32", "constant.overflow")
    assert (d["add_one"].precision, d["add_one"].rule) == ("fp16", "user.allow")


def test_observed_overflow_wins():
    ranges = {"a": TensorRange(-20.0, 20.0, 20.0, 0.0, 0.0, 16), "e": TensorRange(0.0, 5e8, 5e8, 0.0, 0.0, 16)}
    d = _decisions(convert(_exp_model(), allow_ops=["Exp"], ranges=ranges, probe=False))["block0/exp"]
    assert (d.precision, d.rule) == ("fp32", "calibration.overflow")


def test_a_judgement_after_classification_does_not_win():
    """A filter on a raw signal into Log stays FP32 by the policy (signal path); forced, it goes low."""
    m = model(
        [helper.make_node("MatMul", ["audio", "filters"], ["spec"], name="filterbank"),
         helper.make_node("Abs", ["spec"], ["mag"], name="abs"),
         helper.make_node("Log", ["mag"], ["y"], name="log")],
        [vi("audio", F32, [1, 64])], [vi("y", F32, [1, 16])],
        [tensor("filters", weights((64, 16)))],
    )
    assert _decisions(convert(m, probe=False))["filterbank"].rule == "policy.high.signal-path"
    d = _decisions(convert(m, allow_ops=["MatMul"], probe=False))
    assert (d["filterbank"].precision, d["filterbank"].rule) == ("fp16", "user.allow")
    assert d["log"].precision == "fp32"


def test_a_node_without_float_data_is_not_reported():
    m = model(
        [helper.make_node("Shape", ["x"], ["s"], name="shape"), helper.make_node("Exp", ["x"], ["y"], name="exp")],
        [vi("x", F32, [2, 4])], [vi("y", F32, [2, 4]), vi("s", 7, [2])],
    )
    result = convert(m, allow_ops=["Shape", "Exp"], probe=False)
    assert allow_message(result.decisions, result.allowed, "fp16") == (
        "--allow-op/--allow-node forced 1 node(s) into fp16 whatever the policy says ('exp')")
    assert allow_message(convert(m, probe=False).decisions, (), "fp16") is None


def test_tolerance_never_pins_a_forced_node():
    """--tolerance measures and pins units of the low-precision nodes; a node the user forced low is
    none of them (a tolerance nothing low meets pins everything else)."""
    from amp_compiler.onnx.tolerance.refine import refine
    from amp_compiler.options import ConvertOptions
    from amp_compiler.runtime.runner import InProcessRunner

    pinned = _decisions(convert(_exp_model(), allow_ops=["Exp"], pinned_nodes=((0, "p"), (1, "p"), (2, "p")), probe=False))
    assert pinned["block0/exp"].rule == "user.allow" and pinned["mm1"].rule == "tolerance.pinned"
    rng = np.random.default_rng(0)
    samples = [{"x": rng.standard_normal((2, 8)).astype(np.float32)} for _ in range(2)]
    with InProcessRunner() as runner:
        r = refine(_exp_model(), samples, 1e-12, ConvertOptions(allow_ops=frozenset({"Exp"})), runner=runner)
    d = _decisions(r.result)
    assert (d["block0/exp"].precision, d["block0/exp"].rule) == ("fp16", "user.allow")
    assert d["mm1"].precision == d["mm2"].precision == "fp32"


def test_an_allowed_node_scaled_into_fp16_for_its_range_is_said_to_run_scaled_not_kept_out():
    """A MatMul whose stated input range overflows FP16 runs in FP16 on power-of-two scaled operands (the
    GPU providers' range fallback); before, the message said it was kept out of fp16 all the same."""
    m = model([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], [vi("x", F32, [2, 8])],
              [vi("y", F32, [2, 8])], [tensor("w", weights((8, 8), seed=1))])
    result = convert(m, allow_ops=["MatMul"], input_ranges={"x": (-1e6, 1e6)}, runner=InProcessRunner())
    d = _decisions(result)["mm"]  # the probe observed the stated range: scales for the operands
    assert (d.precision, d.rule) == ("fp16", Rule.RANGE_OVERFLOW.value)
    assert allow_message(result.decisions, result.allowed, "fp16") == (
        "--allow-op/--allow-node forced 0 node(s) into fp16 whatever the policy says; 1 in fp16 on power-of-two "
        "scaled operands, their range beyond it ('mm': input-range.overflow)")


# -- attribute-dependent policy: a scatter that sums -----------------------------------------------


@pytest.mark.parametrize("op", ["ScatterElements", "ScatterND"])
def test_a_scatter_add_is_kept_fp32_as_a_segment_sum_and_a_plain_scatter_is_not(op):
    from tests.support.onnx_builders import scatter_hub_model

    summed = _decisions(convert(scatter_hub_model(op, "add"), probe=False))["node"]
    assert (summed.precision, summed.rule) == ("fp32", "policy.high.range")
    assert "segment sum" in summed.reason
    plain = _decisions(convert(scatter_hub_model(op, "none"), probe=False))["node"]
    assert (plain.precision, plain.rule) != ("fp32", "policy.high.range") and "segment sum" not in plain.reason


def test_a_hub_node_summing_every_edge_stays_finite_under_fp16_emulation():
    """3000 edges into node 0: their messages sum past FP16's 65504 (FP32 is finite); the converted
    model computed with exact FP16 storage has no Inf (it had 8 of 8 outputs Inf with the scatter PASS)."""
    import onnx

    from amp_compiler.onnx.measure.checks import run_onnxruntime
    from amp_compiler.onnx.measure.emulate import emulate
    from tests.support.onnx_builders import scatter_hub_model

    m = scatter_hub_model()
    rng = np.random.default_rng(0)
    feeds = {"msg": (rng.standard_normal((3000, 4)) * 40).astype(np.float32), "dst": np.zeros(3000, np.int64)}
    (ref,) = run_onnxruntime(m, feeds)
    assert np.isfinite(ref).all()
    out = convert(onnx.ModelProto.FromString(m.SerializeToString()), probe=False).model
    (low,) = run_onnxruntime(emulate(out), feeds)
    assert np.isfinite(low).all()  # the hub node's sum: 2.0e5
    np.testing.assert_allclose(low, ref, rtol=1e-2, atol=1e-2 * np.abs(ref).max())
