"""Small helpers to build ONNX test graphs by hand."""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from amp_compiler.policy import PolicyTable

F32 = TensorProto.FLOAT
F16 = TensorProto.FLOAT16


def tensor(name: str, array) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(array), name)


def vi(name: str, elem_type: int = F32, shape=None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem_type, shape)


def model(nodes, inputs, outputs, initializers=(), opset: int = 18, ir_version: int = 9, **kw) -> onnx.ModelProto:
    graph = helper.make_graph(list(nodes), kw.pop("name", "g"), list(inputs), list(outputs), list(initializers))
    imports = [helper.make_opsetid("", opset)] + kw.pop("extra_opsets", [])
    m = helper.make_model(graph, opset_imports=imports, **kw)
    m.ir_version = ir_version
    onnx.checker.check_model(m, full_check=True)
    return m


def weights(shape, seed: int = 0, scale: float = 0.3) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


TEST_POLICY = PolicyTable.from_toml(
    """
[[op]]
op = "MatMul"
category = "LOW"
reason = "Tensor Core GEMM"
[[op]]
op = "Conv"
category = "LOW"
reason = "Tensor Core convolution"
[[op]]
op = "Add"
category = "FOLLOW"
reason = "elementwise"
[[op]]
op = "Mul"
category = "FOLLOW"
reason = "elementwise"
[[op]]
op = "Tanh"
category = "FOLLOW"
reason = "bounded"
[[op]]
op = "Softmax"
category = "HIGH"
sensitivity = "arithmetic"
reason = "normalises exponentials"
[op.fp32_inside]
cuda = "test: accumulates in FP32"
[[op]]
op = "Exp"
category = "HIGH"
sensitivity = "range"
reason = "overflows above 11.09"
[[op]]
op = "Log"
category = "HIGH"
sensitivity = "range"
reason = "log of a flushed zero is -inf"
[[op]]
op = "Relu"
category = "PASS"
reason = "precision neutral"
[[op]]
op = "Reshape"
category = "PASS"
reason = "data movement"
[[op]]
op = "Gather"
category = "PASS"
reason = "data movement"
[[op]]
op = "Clip"
category = "PASS"
reason = "bounds"
[[op]]
op = "Where"
category = "PASS"
reason = "select"
[[op]]
op = "Identity"
category = "PASS"
reason = "data movement"
[[op]]
op = "If"
category = "PASS"
reason = "control flow"
[[op]]
op = "Loop"
category = "PASS"
reason = "control flow"
[[op]]
op = "Shape"
category = "NONFLOAT"
reason = "shapes are integers"
[[op]]
op = "Cast"
category = "PASS"
reason = "conversion"
dtype_attr = "to"
[[op]]
op = "BatchNormalization"
category = "FOLLOW"
reason = "affine per channel"
[[op]]
op = "LayerNormalization"
category = "HIGH"
sensitivity = "arithmetic"
reason = "mean and variance"
[op.fp32_inside]
cuda = "test: accumulates in FP32"
"""
)


# ------------------------------------------------------------------ models that are hostile to run


def loop_forever_model() -> onnx.ModelProto:
    """x[1] -> Loop(2**62 iterations of y + 1) -> Unsqueeze -> MatMul: valid, and never ends."""
    body = helper.make_graph(
        [helper.make_node("Add", ["y_in", "one"], ["y_out"]), helper.make_node("Identity", ["c_in"], ["c_out"])],
        "body",
        [vi("i", TensorProto.INT64, []), vi("c_in", TensorProto.BOOL, []), vi("y_in", F32, [1])],
        [vi("c_out", TensorProto.BOOL, []), vi("y_out", F32, [1])],
        [tensor("one", np.ones(1, np.float32))],
    )
    nodes = [
        helper.make_node("Loop", ["M", "cond", "x"], ["y"], body=body),
        helper.make_node("Unsqueeze", ["y", "axes"], ["y2"]),
        helper.make_node("MatMul", ["y2", "w"], ["z"]),
    ]
    inits = [
        tensor("M", np.array(2**62, np.int64)), tensor("cond", np.array(True)),
        tensor("w", np.ones((1, 1), np.float32)), tensor("axes", np.array([0], np.int64)),
    ]
    return model(nodes, [vi("x", F32, [1])], [vi("z", F32, [1, 1])], inits, opset=13, ir_version=8)


def huge_constant_model(n: int = 40_000) -> onnx.ModelProto:
    """x[1] * ReduceSum(ConstantOfShape([n, n])): under 200 bytes, and 4*n*n bytes to run (6.4 GB)."""
    nodes = [
        helper.make_node("ConstantOfShape", ["shape"], ["big"], value=tensor("v", np.ones(1, np.float32))),
        helper.make_node("ReduceSum", ["big"], ["s"], keepdims=0),
        helper.make_node("Mul", ["x", "s"], ["y"]),
    ]
    inits = [tensor("shape", np.array([n, n], np.int64))]
    return model(nodes, [vi("x", F32, [1])], [vi("y", F32, [1])], inits, opset=13, ir_version=8)


def transpose_cast_matmul_model(source: int = TensorProto.INT32, target: int = F32) -> onnx.ModelProto:
    """s [5,2,8] -> Transpose(1,0,2) -> Cast(target) -> MatMul(2-D weight): onnxruntime 1.32's CPU
    provider crashes (SIGSEGV) creating a session of it (MatmulTransposeFusion; see
    amp_compiler.core.plan.Rule.RUNTIME_TRANSPOSE_MATMUL)."""
    nodes = [
        helper.make_node("Transpose", ["s"], ["t"], perm=[1, 0, 2]),
        helper.make_node("Cast", ["t"], ["c"], to=target),
        helper.make_node("MatMul", ["c", "w"], ["o"]),
    ]
    w = tensor("w", weights((8, 3)).astype(helper.tensor_dtype_to_np_dtype(target)))
    return model(nodes, [vi("s", source, [5, 2, 8])], [vi("o", target, [2, 5, 3])], [w], opset=17, ir_version=8)


def ffn_overflow_model():
    """A T5-style block whose FFN output reaches ~1e5 on ordinary inputs, RMS-normalised after."""
    d, h = 64, 256
    r = np.random.default_rng(1)
    w_in = (r.standard_normal((d, d)) / math.sqrt(d)).astype(np.float32)
    w1 = (r.standard_normal((d, h)) * 3.0).astype(np.float32)  # hidden ~ 20
    w2 = (r.standard_normal((h, d)) * 300.0).astype(np.float32)  # output ~ 1e5: beyond FP16
    w3 = (r.standard_normal((d, d)) / math.sqrt(d)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w_in"], ["a"], name="proj_in"),
        helper.make_node("MatMul", ["a", "w1"], ["hpre"], name="ffn_in"),
        helper.make_node("Relu", ["hpre"], ["hid"], name="ffn_relu"),
        helper.make_node("MatMul", ["hid", "w2"], ["y"], name="ffn_out"),
        helper.make_node("Mul", ["y", "y"], ["sq"], name="square"),
        helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], keepdims=1, name="mean_square"),
        helper.make_node("Sqrt", ["ms"], ["rms"], name="rms"),
        helper.make_node("Div", ["y", "rms"], ["normed"], name="normalise"),
        helper.make_node("MatMul", ["normed", "w3"], ["out"], name="proj_out"),
    ]
    inits = [tensor("w_in", w_in), tensor("w1", w1), tensor("w2", w2), tensor("w3", w3),
             tensor("axes", np.array([-1], np.int64))]
    return model(nodes, [vi("x", F32, [8, d])], [vi("out", F32, [8, d])], inits)


def scatter_hub_model(op: str = "ScatterElements", reduction: str = "add", edges: int = 3000, nodes: int = 8,
                      dim: int = 4) -> onnx.ModelProto:
    """A GNN's aggregation: messages ``Relu(msg @ W)`` of ``edges`` edges scattered with ``reduction``
    into ``nodes`` node rows (edge ``e`` into node ``dst[e]``), then ``@ Wo``: a hub receiving every edge
    sums them all, then the mean over the edges (``node`` is the scatter's name). Inputs: msg [E, D], dst [E]
    int64."""
    if op == "ScatterElements":
        index = [
            helper.make_node("Reshape", ["dst", "shape_e1"], ["dst_e1"]),
            helper.make_node("Expand", ["dst_e1", "shape_ed"], ["idx"]),
        ]
        scatter = helper.make_node(op, ["zeros", "idx", "m"], ["agg"], name="node", axis=0, reduction=reduction)
    else:
        index = [helper.make_node("Reshape", ["dst", "shape_e1"], ["idx"])]
        scatter = helper.make_node(op, ["zeros", "idx", "m"], ["agg"], name="node", reduction=reduction)
    return model(
        [helper.make_node("MatMul", ["msg", "w"], ["mw"], name="mm"), helper.make_node("Relu", ["mw"], ["m"]),
         *index, scatter, helper.make_node("Div", ["agg", "count"], ["mean"]),
         helper.make_node("MatMul", ["mean", "wo"], ["y"], name="out")],
        [vi("msg", F32, [edges, dim]), vi("dst", TensorProto.INT64, [edges])], [vi("y", F32, [nodes, 2])],
        [tensor("w", weights((dim, dim), seed=3, scale=1.0)), tensor("wo", weights((dim, 2), seed=4, scale=1.0)),
         tensor("zeros", np.zeros((nodes, dim), np.float32)), tensor("shape_e1", np.array([edges, 1], np.int64)),
         tensor("shape_ed", np.array([edges, dim], np.int64)), tensor("count", np.array(edges, np.float32))],
    )


#: Two scores 1 + 2^-13 apart per unit of x[:, 0]: FP16 (11 significant bits) stores them equal, and
#: ArgMax (TopK) then takes the first, so every row with x[:, 0] > 0 changes its label under FP16.
NEAR_TIE_WEIGHTS = np.array([[1.0, 1.0 + 2.0**-13, -1.0], [0.0, 0.0, 0.0]], np.float32)
#: Scores far apart: no label changes under FP16.
CLEAR_WEIGHTS = np.array([[1.0, 2.0, -1.0], [0.5, 0.0, 0.0]], np.float32)


def label_model(weights: np.ndarray, topk: bool = False, rows: int = 64) -> onnx.ModelProto:
    """x[rows, 2] @ weights -> ArgMax's int64 ``label`` (``topk``: TopK(k=2)'s float ``top`` and int64
    ``classes`` instead). x is padded with zeros to 16 columns, and weights with zero rows: a product over
    fewer of a graph input stays FP32 (``policy.high.raw-small-product``), and the labels would not change."""
    head = (helper.make_node("TopK", ["z", "k"], ["top", "classes"], name="topk", axis=-1) if topk
            else helper.make_node("ArgMax", ["z"], ["label"], name="argmax", axis=1, keepdims=0))
    outputs = ([vi("top", F32, [rows, 2]), vi("classes", TensorProto.INT64, [rows, 2])] if topk
               else [vi("label", TensorProto.INT64, [rows])])
    padded = np.zeros((16, weights.shape[1]), np.float32)
    padded[: weights.shape[0]] = weights
    inits = [tensor("w", padded), tensor("pads", np.array([0, 0, 0, 16 - weights.shape[0]], np.int64))]
    inits += [tensor("k", np.array([2], np.int64))] if topk else []
    return model([helper.make_node("Pad", ["x", "pads"], ["x16"], name="pad"),
                  helper.make_node("MatMul", ["x16", "w"], ["z"], name="matmul"), head],
                 [vi("x", F32, [rows, 2])], outputs, inits)


# The tabular model's raw features (area in m², year built, income, rooms) and their ranges: income
# reaches 3e5, beyond FP16's largest value.
TABULAR_LOW = np.array([30, 1900, 2e4, 1], np.float32)
TABULAR_HIGH = np.array([400, 2024, 3e5, 8], np.float32)


def tabular_model() -> onnx.ModelProto:
    """Gemm -> Relu -> Gemm on x[B, 4] unnormalised features (sweep Q, B): the first layer's weights about
    3 / the feature's span, the centering learned in its bias, so that the hidden layer is O(1) while x
    and the first Gemm's static bounds over [0, 3e5] leave FP16's range."""
    rng = np.random.default_rng(0)
    scale = np.array([1 / 370, 1 / 124, 1 / 2.8e5, 1 / 7.0], np.float32) * 3
    w1 = (rng.standard_normal((4, 16)) * scale[:, None]).astype(np.float32)
    mid = np.array([215, 1962, 1.6e5, 4.5], np.float32)
    b1 = (-(mid @ w1) + 0.3 * rng.standard_normal(16)).astype(np.float32)
    w2 = (rng.standard_normal((16, 1)) * 0.35).astype(np.float32)
    # x >= 0, so the Relu changes no value; it keeps the Gemm from reading the raw input directly, which with K = 4
    # is policy.high.raw-small-product's FP32 (passes/analysis/raw_products.py) and leaves range scaling untested
    nodes = [helper.make_node("Relu", ["x"], ["xr"], name="features"),
             helper.make_node("Gemm", ["xr", "w1", "b1"], ["h"], name="hidden"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Gemm", ["r", "w2"], ["y"], name="out")]
    return model(nodes, [vi("x", F32, ["B", 4])], [vi("y", F32, ["B", 1])],
                 [tensor("w1", w1), tensor("b1", b1), tensor("w2", w2)], opset=17)
