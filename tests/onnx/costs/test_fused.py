"""onnxruntime's fused ops are costed with their real FLOPs and counted as Tensor Core ops.

Before, every com.microsoft op cost one FLOP per output element, or nothing when onnx's inference had
no shape for it, so a fully FP32 fused BERT reported 99.9% of its FLOPs in low precision.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from amp_compiler.onnx.costs.costs import estimate
from amp_compiler.policy import default_table
from tests.support.onnx_builders import F32, tensor, vi, weights

F16 = onnx.TensorProto.FLOAT16
MS = helper.make_opsetid("com.microsoft", 1)


def _model(nodes, inputs, outputs, inits) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), MS])
    m.ir_version = 9
    return m


def test_attention_projection_scores_and_softmax() -> None:
    b, s, d, heads = 2, 16, 64, 4
    node = helper.make_node("Attention", ["x", "w", "bias"], ["y"], domain="com.microsoft", num_heads=heads)
    m = _model([node], [vi("x", F16, [b, s, d])], [vi("y", F16, [b, s, d])],
               [tensor("w", weights((d, 3 * d)).astype(np.float16)), tensor("bias", np.zeros(3 * d, np.float16))])
    (cost,) = estimate(m).nodes
    projection = 2 * b * s * d * 3 * d
    scores_and_context = 2 * b * s * s * (d + d)
    softmax = 5 * b * heads * s * s
    assert cost.flops == projection + scores_and_context + softmax
    assert cost.tensor_core is True and cost.tensor_core_note == "head size=16"


def test_group_query_attention_with_a_kv_cache() -> None:
    b, s, past, heads, kv_heads, d = 1, 1, 7, 4, 2, 16
    inputs = ["q", "k", "v", "past_key", "past_value", "seqlens_k", "total_len"]
    node = helper.make_node("GroupQueryAttention", inputs, ["y", "present_key", "present_value"],
                            domain="com.microsoft", num_heads=heads, kv_num_heads=kv_heads)
    m = _model(
        [node],
        [vi("q", F16, [b, s, heads * d]), vi("k", F16, [b, s, kv_heads * d]), vi("v", F16, [b, s, kv_heads * d]),
         vi("past_key", F16, [b, kv_heads, past, d]), vi("past_value", F16, [b, kv_heads, past, d]),
         vi("seqlens_k", onnx.TensorProto.INT32, [b]), vi("total_len", onnx.TensorProto.INT32, [])],
        [vi("y", F16, [b, s, heads * d]), vi("present_key", F16, None), vi("present_value", F16, None)], [],
    )
    (cost,) = estimate(m).nodes
    t = past + s
    assert cost.flops == 4 * b * s * t * heads * d + 5 * b * heads * s * t
    assert cost.tensor_core is True


def test_matmul_nbits_from_its_attributes() -> None:
    m_rows, k, n, block = 8, 64, 32, 32
    node = helper.make_node("MatMulNBits", ["a", "b", "scales"], ["y"], domain="com.microsoft",
                            K=k, N=n, bits=4, block_size=block)
    blob = np.zeros((n, k // block, block // 2), np.uint8)
    m = _model([node], [vi("a", F16, [m_rows, k])], [vi("y", F16, [m_rows, n])],
               [tensor("b", blob), tensor("scales", np.ones(n * k // block, np.float16))])
    (cost,) = estimate(m).nodes
    assert cost.flops == 2 * m_rows * n * k
    assert cost.tensor_core is True and cost.tensor_core_note == "K=64, N=32"


def test_shapes_of_fused_outputs_come_from_symbolic_inference() -> None:
    """onnx's inference gives SkipLayerNormalization's output no shape; the MatMul after it is still
    costed (2*M*N*K), from onnxruntime's symbolic shape inference."""
    nodes = [
        helper.make_node("SkipLayerNormalization", ["x", "skip", "gamma"], ["n"], domain="com.microsoft"),
        helper.make_node("MatMul", ["n", "w"], ["y"]),
    ]
    m = _model(nodes, [vi("x", F32, [4, 8]), vi("skip", F32, [4, 8])], [vi("y", F32, [4, 16])],
               [tensor("gamma", np.ones(8, np.float32)), tensor("w", weights((8, 16)))])
    inferred = onnx.shape_inference.infer_shapes(m)
    assert "n" not in {v.name for v in inferred.graph.value_info if v.type.tensor_type.HasField("shape")}
    costs = estimate(m).nodes
    assert costs[1].flops == 2 * 4 * 16 * 8
    assert costs[0].flops == 8 * 4 * 8  # about 8 per element: adds, mean, variance, scale, shift
    assert costs[0].bytes == 4 * (4 * 8 * 3 + 8)  # x, skip, n and gamma in FP32


def test_the_fused_matrix_products_are_tensor_core_ops() -> None:
    table = default_table()
    for op in ("Attention", "MultiHeadAttention", "GroupQueryAttention", "PackedAttention", "MatMulNBits",
               "FusedMatMul"):
        assert table.is_tensor_core("com.microsoft", op), op
    for op in ("SkipLayerNormalization", "QuickGelu", "BiasGelu", "FastGelu", "EmbedLayerNormalization"):
        assert not table.is_tensor_core("com.microsoft", op), op
