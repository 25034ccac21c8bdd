"""Raw small products (passes/analysis/raw_products.py): a Tensor Core op with K < 16 reading values computed
linearly from a raw float input stays FP32 (``policy.high.raw-small-product``); long contractions, learned
activations and token embeddings stay low."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.shape_inference
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

from amp_compiler import convert
from amp_compiler.onnx.graph.precision_graph import build_precision_graph
from amp_compiler.passes.analysis.raw_products import contraction_size
from amp_compiler.policy import default_table
from amp_compiler.targets import Target
from tests.support.onnx_builders import F32, model, tensor, vi, weights

RULE = "policy.high.raw-small-product"


def _rules(m, **options) -> dict[str, tuple[str, str]]:
    return {d.node: (d.precision, d.rule) for d in convert(m, probe=False, **options).decisions}


def _gram():
    """Pairwise squared distances of coordinates pos [N, 3]: |a|^2 + |b|^2 - 2 a.b^T (PointNet++'s square_distance)."""
    nodes = [
        helper.make_node("Transpose", ["pos"], ["posT"], name="pos_t", perm=[1, 0]),
        helper.make_node("MatMul", ["pos", "posT"], ["gram"], name="gram"),
        helper.make_node("Mul", ["pos", "pos"], ["p2"], name="square"),
        helper.make_node("ReduceSum", ["p2", "axis1"], ["sq"], name="norms", keepdims=1),
        helper.make_node("Transpose", ["sq"], ["sqT"], name="norms_t", perm=[1, 0]),
        helper.make_node("Add", ["sq", "sqT"], ["s2"], name="add_norms"),
        helper.make_node("Mul", ["gram", "two"], ["g2"], name="twice"),
        helper.make_node("Sub", ["s2", "g2"], ["d2"], name="cancel"),
    ]
    inits = [tensor("axis1", np.array([1], np.int64)), tensor("two", np.array(2.0, np.float32))]
    return model(nodes, [vi("pos", F32, ["n", 3])], [vi("d2", F32, ["n", "n"])], inits)


def test_the_gram_matmul_of_raw_coordinates_stays_fp32_and_says_why():
    res = convert(_gram(), probe=False)
    by_node = {d.node: d for d in res.decisions}
    assert (by_node["gram"].precision, by_node["gram"].rule) == ("fp32", RULE)
    reason = by_node["gram"].reason
    assert "K = 3" in reason and "'pos'" in reason and "cancelled" in reason, reason
    assert "gains nothing on Tensor Cores" in reason and "to within 2" in reason and "beyond 65504" in reason, reason
    assert by_node["cancel"].precision == "fp32"
    bf16 = {d.node: d for d in convert(_gram(), target="bf16", probe=False).decisions}["gram"]
    assert bf16.rule == RULE and "BF16 stores" in bf16.reason and "to within 16" in bf16.reason, bf16.reason


def test_a_user_allowed_gram_matmul_stays_low():
    assert _rules(_gram(), allow_nodes=["^gram$"])["gram"] == ("fp16", "user.allow")


def _stem(channels: int, kernel: int):
    """A Conv on a raw image x [1, C, 32, 32] (K = C * kernel^2), then a Relu and a 1x1 Conv of its features."""
    nodes = [helper.make_node("Conv", ["x", "W"], ["h"], name="stem", pads=[kernel // 2] * 4),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "W2"], ["y"], name="head")]
    inits = [tensor("W", weights((16, channels, kernel, kernel))), tensor("W2", weights((8, 16, 1, 1), seed=1))]
    return model(nodes, [vi("x", F32, [1, channels, 32, 32])], [vi("y", F32, [1, 8, 32, 32])], inits)


def test_a_long_contraction_over_raw_pixels_stays_low_a_short_one_fp32():
    long = _rules(_stem(3, 7))  # K = 3 * 7 * 7 = 147: an image stem gains from Tensor Cores
    assert long["stem"] == ("fp16", "policy.low") and long["head"][0] == "fp16"
    short = _rules(_stem(3, 1))  # K = 3: a 1x1 Conv over raw RGB values
    assert short["stem"] == ("fp32", RULE) and short["head"][0] == "fp16"  # K = 16, a learned feature


def _hidden_gram():
    """A K = 3 Gram matrix of learned features: Relu(x @ W) [N, 3] times its transpose."""
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="proj"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Transpose", ["r"], ["rT"], name="t", perm=[1, 0]),
             helper.make_node("MatMul", ["r", "rT"], ["y"], name="gram")]
    return model(nodes, [vi("x", F32, ["n", 32])], [vi("y", F32, ["n", "n"])], [tensor("W", weights((32, 3)))])


def _embedding_gram():
    """A K = 3 product of token embeddings: Gather of a table by ids is no raw float input."""
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], name="embed"),
             helper.make_node("Transpose", ["e"], ["eT"], name="t", perm=[1, 0]),
             helper.make_node("MatMul", ["e", "eT"], ["y"], name="gram")]
    return model(nodes, [vi("ids", TensorProto.INT64, ["n"])], [vi("y", F32, ["n", "n"])],
                 [tensor("table", weights((100, 3)))])


@pytest.mark.parametrize("build", [_hidden_gram, _embedding_gram], ids=["learned-features", "token-embeddings"])
def test_a_short_product_of_values_not_computed_from_raw_inputs_stays_low(build):
    assert _rules(build())["gram"] == ("fp16", "policy.low")


def _tabular(trans_a: int):
    """A first Gemm over raw features x [B, 4] (incomes up to 3e5), ``transA`` reading x^T [4, B]."""
    x = vi("x", F32, [4, "b"] if trans_a else ["b", 4])
    nodes = [helper.make_node("Gemm", ["x", "W", "b1"], ["h"], name="first", transA=trans_a),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Gemm", ["r", "W2", "b2"], ["y"], name="second")]
    inits = [tensor("W", weights((4, 64))), tensor("b1", weights((64,), seed=1)),
             tensor("W2", weights((64, 1), seed=2)), tensor("b2", weights((1,), seed=3))]
    return model(nodes, [x], [vi("y", F32, ["b", 1])], inits)


@pytest.mark.parametrize("trans_a", [0, 1])
def test_the_first_gemm_over_raw_features_stays_fp32_the_second_low(trans_a):
    rules = _rules(_tabular(trans_a))
    assert rules["first"] == ("fp32", RULE) and rules["second"][0] == "fp16"  # K = 64


def _graph(m):
    proto = onnx.shape_inference.infer_shapes(m, strict_mode=True)
    return build_precision_graph(ir.from_proto(proto), Target.FP16, default_table())


def _k(m, name: str) -> int | None:
    graph = _graph(m)
    return next(contraction_size(v) for v in graph.vertices if v.node is not None and v.node.name == name)


def test_contraction_sizes():
    assert _k(_gram(), "gram") == 3
    assert _k(_stem(3, 7), "stem") == 147 and _k(_stem(3, 7), "head") == 16
    assert _k(_tabular(1), "first") == 4 and _k(_tabular(0), "second") == 64
    einsum = model([helper.make_node("Einsum", ["a", "b"], ["y"], name="e", equation="nd,md->nm")],
                   [vi("a", F32, ["n", 3]), vi("b", F32, ["m", 3])], [vi("y", F32, ["n", "m"])])
    assert _k(einsum, "e") == 3
    assert _rules(einsum)["e"] == ("fp32", RULE)
    # an ellipsis (read as torch reads it, amp_compiler/core/einsum.py; before: K unknown, the Einsum low)
    ellipsis = model([helper.make_node("Einsum", ["a", "b"], ["y"], name="e", equation="...nd,...md->...nm")],
                     [vi("a", F32, [2, "n", 3]), vi("b", F32, [2, "m", 3])], [vi("y", F32, [2, "n", "m"])])
    assert _k(ellipsis, "e") == 3
    assert _rules(ellipsis)["e"] == ("fp32", RULE)
    dynamic = model([helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")],
                    [vi("a", F32, ["n", "k"]), vi("b", F32, ["k", 4])], [vi("y", F32, ["n", 4])])
    assert _k(dynamic, "mm") is None  # K not known statically: left to the other rules
    assert _rules(dynamic)["mm"] == ("fp16", "policy.low")
