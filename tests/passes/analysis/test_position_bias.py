"""Position biases (passes/analysis/position_bias.py): the linear path from positions into a Softmax's
logits (ALiBi) stays FP32 (``policy.high.position-bias``); masks, learned biases, features and the
score MatMuls stay low."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from amp_compiler import convert
from tests.support.onnx_builders import F32, model, tensor, vi, weights

H, D = 4, 16
_SLOPES = (2.0 ** -np.arange(1, H + 1)).astype(np.float32)[:, None, None]  # [H, 1, 1]
RULE = "policy.high.position-bias"


def _rules(m, **options) -> dict[str, tuple[str, str]]:
    return {d.node: (d.precision, d.rule) for d in convert(m, probe=False, **options).decisions}


def _attention(bias: list, bias_out: str, inits: list, inputs: list):
    """The last query's attention over S keys (scores [H, 1, S]) plus ``bias_out``, Softmax, @ V, output MatMul."""
    nodes = [
        helper.make_node("MatMul", ["x", "Wk"], ["k"], name="k_proj"),              # [S, H*D]
        helper.make_node("Reshape", ["k", "khd"], ["kr"], name="k_heads"),          # [S, H, D]
        helper.make_node("Transpose", ["kr"], ["kt"], name="k_t", perm=[1, 2, 0]),  # [H, D, S]
        helper.make_node("MatMul", ["q", "kt"], ["s"], name="scores"),              # [H, 1, S]
        *bias,
        helper.make_node("Add", ["s", bias_out], ["sb"], name="add_bias"),
        helper.make_node("Softmax", ["sb"], ["p"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["x", "Wv"], ["v"], name="v_proj"),
        helper.make_node("Reshape", ["v", "khd"], ["vr"], name="v_heads"),
        helper.make_node("Transpose", ["vr"], ["vt"], name="v_t", perm=[1, 0, 2]),  # [H, S, D]
        helper.make_node("MatMul", ["p", "vt"], ["o"], name="attn_v"),             # [H, 1, D]
        helper.make_node("Reshape", ["o", "flat"], ["of"], name="flat"),
        helper.make_node("MatMul", ["of", "Wo"], ["y"], name="o_proj"),
    ]
    inits = [tensor("Wk", weights((D, H * D))), tensor("Wv", weights((D, H * D), seed=1)),
             tensor("Wo", weights((H * D, D), seed=2)), tensor("q", weights((H, 1, D), seed=3)),
             tensor("khd", np.array([-1, H, D], np.int64)), tensor("flat", np.array([1, H * D], np.int64)), *inits]
    return model(nodes, [vi("x", F32, ["s", D]), *inputs], [vi("y", F32, [1, D])], inits)


def _bloom():
    """BLOOM's build_alibi_tensor as torch.onnx (dynamo) writes it: cumsum(mask) - 1 on integers, Cast, x slopes."""
    bias = [helper.make_node("CumSum", ["mask", "axis0"], ["cs"], name="cumsum"),
            helper.make_node("Sub", ["cs", "one"], ["pos_i"], name="minus_one"),
            helper.make_node("Mul", ["pos_i", "mask"], ["pos_m"], name="times_mask"),
            helper.make_node("Cast", ["pos_m"], ["pos"], name="positions", to=TensorProto.FLOAT),
            helper.make_node("Mul", ["slopes", "pos"], ["alibi"], name="slope_mul")]
    inits = [tensor("slopes", _SLOPES), tensor("axis0", np.array(0, np.int64)), tensor("one", np.array(1, np.int64))]
    return _attention(bias, "alibi", inits, [vi("mask", TensorProto.INT64, ["s"])])


def _mpt():
    """MPT's relative ALiBi: Range(1 - S, 1) in float, x slopes."""
    bias = [helper.make_node("Shape", ["x"], ["shp"], name="shape", end=1),
            helper.make_node("Squeeze", ["shp"], ["n"], name="n"),
            helper.make_node("Sub", ["one_i", "n"], ["start"], name="start"),
            helper.make_node("Cast", ["start"], ["start_f"], name="start_f", to=TensorProto.FLOAT),
            helper.make_node("Range", ["start_f", "one_f", "one_f"], ["rel"], name="range"),
            helper.make_node("Mul", ["rel", "slopes"], ["alibi"], name="slope_mul")]
    inits = [tensor("slopes", _SLOPES), tensor("one_i", np.array(1, np.int64)),
             tensor("one_f", np.array(1.0, np.float32))]
    return _attention(bias, "alibi", inits, [])


def _feeds(s: int) -> dict[str, np.ndarray]:
    x = np.random.default_rng(1).standard_normal((s, D)).astype(np.float32)
    return {"x": x, "mask": np.ones(s, np.int64)}


@pytest.mark.parametrize("build, path", [
    (_bloom, ["positions", "slope_mul", "add_bias", "softmax"]),
    (_mpt, ["range", "slope_mul", "add_bias", "softmax"]),
])
def test_alibi_bias_its_score_add_and_the_softmax_stay_fp32(build, path):
    rules = _rules(build())
    for name in path:
        if name == "range":  # HIGH already: FP32 by its own rule
            assert rules[name][0] == "fp32", rules[name]
            continue
        assert rules[name] == ("fp32", RULE), (name, rules[name])
    for name in ("scores", "k_proj", "v_proj", "attn_v", "o_proj"):
        assert rules[name][0] == "fp16", (name, rules[name])


def test_the_reason_names_the_softmax_the_positions_and_the_bias_error():
    reason = {d.node: d.reason for d in convert(_bloom(), probe=False).decisions}["add_bias"]
    assert "Softmax node 'softmax'" in reason and "'positions'" in reason, reason
    assert "1024 to within 0.5" in reason and "8192 to within 4" in reason, reason


def test_alibi_at_long_sequence_is_accurate():
    """The last query's output at 4096 keys: 11.7% of range (probabilities 34%) with the bias path in FP16."""
    from amp_compiler.onnx.compare import compare_models

    fp32 = _bloom()
    out = compare_models(fp32, convert(fp32, probe=False).model, [_feeds(4096)]).outputs[0]
    assert out.error_of_range < 0.01, out


def _masked(bias_kind: str):
    """Biases that are no positions: BERT's (1 - mask) * -10000 of an integer input, a float input's features,
    T5's Gather of a learned table by position buckets."""
    if bias_kind == "mask":
        bias = [helper.make_node("Cast", ["mask"], ["mf"], name="mask_f", to=TensorProto.FLOAT),
                helper.make_node("Sub", ["one_f", "mf"], ["inv"], name="invert"),
                helper.make_node("Mul", ["inv", "big"], ["bias"], name="mask_bias")]
        inits = [tensor("one_f", np.array(1.0, np.float32)), tensor("big", np.array(-10000.0, np.float32))]
        return _attention(bias, "bias", inits, [vi("mask", TensorProto.INT64, ["s"])])
    if bias_kind == "features":
        bias = [helper.make_node("Mul", ["feat", "slopes"], ["bias"], name="feat_bias")]
        return _attention(bias, "bias", [tensor("slopes", _SLOPES)], [vi("feat", F32, [1, 1, "s"])])
    bias = [helper.make_node("Shape", ["x"], ["shp"], name="shape", end=1),
            helper.make_node("Squeeze", ["shp"], ["n"], name="n"),
            helper.make_node("Range", ["zero_i", "n", "one_i"], ["pos"], name="range"),
            helper.make_node("Clip", ["pos", "zero_i", "top"], ["bucket"], name="buckets"),
            helper.make_node("Gather", ["table", "bucket"], ["g"], name="lookup", axis=1),  # [H, S]
            helper.make_node("Unsqueeze", ["g", "axis1"], ["bias"], name="bias_u")]
    inits = [tensor("table", weights((H, 32), seed=4)), tensor("zero_i", np.array(0, np.int64)),
             tensor("one_i", np.array(1, np.int64)), tensor("top", np.array(31, np.int64)),
             tensor("axis1", np.array([1], np.int64))]
    return _attention(bias, "bias", inits, [])


@pytest.mark.parametrize("bias_kind", ["mask", "features", "t5"])
def test_masks_features_and_learned_biases_are_not_positions(bias_kind):
    rules = _rules(_masked(bias_kind))
    assert not [n for n, (_, rule) in rules.items() if rule == RULE], rules
    assert rules["softmax"][0] == "fp16", rules["softmax"]


def _explicit(name: str, relative: bool = True):
    """Positions as an int64 graph input (``position_ids``, ``cache_position``: a decoder's decoding step), cast
    to float: relative ALiBi ``|p_i - p_j| x slopes`` (relative) or BLOOM's absolute ``slopes x p`` (not)."""
    cast = helper.make_node("Cast", [name], ["pf"], name="positions", to=TensorProto.FLOAT)
    if relative:
        bias = [cast, helper.make_node("Unsqueeze", ["pf", "axis1"], ["pi"], name="rows"),
                helper.make_node("Unsqueeze", ["pf", "axis0"], ["pj"], name="cols"),
                helper.make_node("Sub", ["pi", "pj"], ["rel"], name="distance"),
                helper.make_node("Abs", ["rel"], ["dist"], name="abs"),
                helper.make_node("Slice", ["dist", "last", "end", "axis0"], ["row"], name="last_query"),
                helper.make_node("Mul", ["slopes", "row"], ["alibi"], name="slope_mul")]
    else:
        bias = [cast, helper.make_node("Mul", ["slopes", "pf"], ["alibi"], name="slope_mul")]
    inits = [tensor("slopes", _SLOPES), tensor("axis0", np.array([0], np.int64)),
             tensor("axis1", np.array([1], np.int64)), tensor("last", np.array([-1], np.int64)),
             tensor("end", np.array([np.iinfo(np.int64).max], np.int64))]
    return _attention(bias, "alibi", inits, [vi(name, TensorProto.INT64, ["s"])])


@pytest.mark.parametrize("name, relative", [
    ("position_ids", True), ("cache_position", True), ("idx", True),  # idx: by what it does (i - j)
    ("position_ids", False), ("pos", False),  # absolute positions: by name
])
def test_positions_given_as_an_integer_input_are_positions(name, relative):
    """FP16 holds integers exactly up to 2048: at decoding positions 3000-8000 the distance rounds by 2-4."""
    rules = _rules(_explicit(name, relative))
    path = ["positions", "slope_mul", "add_bias", "softmax"] + (["distance", "abs"] if relative else [])
    for node in path:
        assert rules[node] == ("fp32", RULE), (node, rules[node])
    for node in ("scores", "k_proj", "v_proj", "attn_v", "o_proj"):
        assert rules[node][0] == "fp16", (node, rules[node])


@pytest.mark.parametrize("name", ["attention_mask", "segment"])
def test_integer_inputs_that_are_no_positions_stay_low(name):
    """A 0/1 attention_mask cast to float (exact in FP16), even subtracted from itself; an integer input neither
    named like positions nor read as a distance (absolute, by an unknown name)."""
    m = _explicit(name, relative=name == "attention_mask")
    rules = _rules(m)
    assert not [n for n, (_, rule) in rules.items() if rule == RULE], rules
    assert rules["softmax"][0] == "fp16", rules["softmax"]


def test_bert_attention_mask_of_an_int64_input_stays_low():
    m = _masked("mask")
    m.graph.input[1].name = "attention_mask"
    for node in m.graph.node:
        node.input[:] = ["attention_mask" if i == "mask" else i for i in node.input]
    rules = _rules(m)
    assert not [n for n, (_, rule) in rules.items() if rule == RULE], rules


def test_the_shape_of_an_integer_input_is_no_position():
    """GPT-2's input_ids: their length (Shape) is subtracted from itself (seq - past) and shapes a Reshape on the way
    to the softmax; the ids' values never reach a float, so nothing is a position (13/13 Tensor Core ops low)."""
    m = _explicit("input_ids", relative=False)
    graph = m.graph
    graph.node.insert(0, helper.make_node("Shape", ["input_ids"], ["n"], name="length"))
    graph.node.insert(1, helper.make_node("Sub", ["n", "n"], ["zero"], name="n_minus_n"))
    graph.node.insert(2, helper.make_node("Add", ["zero", "khd"], ["khd2"], name="shape_plus"))
    for node in graph.node:
        if node.name == "positions":  # the bias from a constant, not from input_ids
            node.input[:] = ["fixed"]
        if node.name == "k_heads":
            node.input[1] = "khd2"
    graph.initializer.append(tensor("fixed", np.arange(4, dtype=np.int64)))
    graph.node.insert(3, helper.make_node("Size", ["input_ids"], ["size"], name="size"))
    rules = _rules(m)
    assert not [n for n, (_, rule) in rules.items() if rule == RULE], rules
