"""FLOPs and Tensor Core dims of onnxruntime's fused ops (``com.microsoft``), for the cost model.

A multiply-add counts 2, as in :mod:`amp_compiler.onnx.costs.costs`. B is the batch, S the new tokens, T the
tokens attended to (S plus the past), H the query heads, d the head size. The formulas follow the
ops' definitions in onnxruntime's contrib op documentation:

- Attention: the QKV projection ``2·B·S·D_in·(Dq+Dk+Dv)``, the two batched GEMMs ``2·B·S·T·(Dq+Dv)``,
  and the softmax, about 5 per score (``5·B·H·S·T``);
- MultiHeadAttention, GroupQueryAttention, PackedAttention: the same without (MHA, GQA) or with
  (PackedAttention) the projection; grouped-query attention shares key/value heads but computes
  every query head's scores (``4·B·S·T·H·d``), plus its rotary embedding (3 per rotated element);
- MatMulNBits: ``2·M·N·K`` (K and N are attributes; M the rows of A), plus the bias;
- FusedMatMul and GemmFastGelu: MatMul's ``2·M·N·K`` with the transposes applied (plus 8 per output
  element for the GELU);
- the fused elementwise and normalization ops: :data:`PER_ELEMENT` FLOPs per output element (one
  per element, as for every other numeric op, would understate a fused GELU or layer norm).

Shapes come from the caller (``shape(name)``: a tuple with unknown dims as 1, or None); a formula
whose shapes are unknown gives None and the caller falls back to one FLOP per output element.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import onnx

__all__ = ["attr", "fused_flops", "fused_gemm_dims"]

Shape = tuple[int, ...]
ShapeOf = Callable[[str], Shape | None]

SOFTMAX_FLOPS = 5  # per attention score: max, subtract, exp, sum, divide

# FLOPs per output element of the fused elementwise and normalization ops.
PER_ELEMENT = {
    "QuickGelu": 4,  # x * sigmoid(alpha * x)
    "FastGelu": 9,  # tanh approximation, plus the bias
    "BiasGelu": 9,  # erf GELU plus the bias
    "Gelu": 8,
    "GemmFastGelu": 8,  # on top of its GEMM
    "SkipLayerNormalization": 8,  # skip and bias adds, mean, variance, scale and shift
    "SkipSimplifiedLayerNormalization": 6,  # skip add, mean of squares, scale
    "EmbedLayerNormalization": 8,  # the gathers' sum, then layer norm
    "SimplifiedLayerNormalization": 4,  # mean of squares, scale (also in the default domain)
    "RotaryEmbedding": 3,
}


def attr(node: onnx.NodeProto, name: str, default):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _input(node: onnx.NodeProto, shape: ShapeOf, i: int) -> Shape | None:
    return shape(node.input[i]) if i < len(node.input) and node.input[i] else None


def _attention(node: onnx.NodeProto, shape: ShapeOf) -> int | None:
    x, w = _input(node, shape, 0), _input(node, shape, 1)
    if not x or not w or len(x) != 3:
        return None
    b, s, d_in = x
    sizes = attr(node, "qkv_hidden_sizes", None) or [w[-1] // 3] * 3
    dq, dk, dv = sizes
    past = _input(node, shape, 4)  # (2, B, H, P, d)
    t = s + (past[3] if past and len(past) == 5 else 0)
    heads = attr(node, "num_heads", 1)
    return 2 * b * s * d_in * (dq + dk + dv) + 2 * b * s * t * (dq + dv) + SOFTMAX_FLOPS * b * heads * s * t


def _multi_head_attention(node: onnx.NodeProto, shape: ShapeOf) -> int | None:
    q, k, v = (_input(node, shape, i) for i in range(3))
    heads = attr(node, "num_heads", 1)
    if not q:
        return None
    if len(q) == 5:  # packed QKV (B, S, H, 3, d)
        b, s, _, _, d = q
        dqk = dv = heads * d
        length = s
    elif len(q) == 3 and k:
        b, s, dqk = q
        length = k[2] if len(k) == 4 else k[1]  # key as (B, H, L, d) or (B, L, D)
        dv = v[1] * v[3] if v and len(v) == 4 else (v[-1] if v else dqk)
    else:
        return None
    past = _input(node, shape, 6)  # (B, H, P, d)
    t = length + (past[2] if past and len(past) == 4 else 0)
    return 2 * b * s * t * (dqk + dv) + SOFTMAX_FLOPS * b * heads * s * t


def _group_query_attention(node: onnx.NodeProto, shape: ShapeOf) -> int | None:
    q = _input(node, shape, 0)
    if not q or len(q) != 3:
        return None
    b, s, width = q
    heads, kv_heads = attr(node, "num_heads", 1), attr(node, "kv_num_heads", 1)
    packed = _input(node, shape, 1) is None
    d = width // (heads + 2 * kv_heads) if packed else width // heads
    past = _input(node, shape, 3)  # (B, H_kv, P, d)
    t = s + (past[2] if past and len(past) == 4 else 0)
    rotary = 3 * b * s * (heads + kv_heads) * d if attr(node, "do_rotary", 0) else 0
    return 4 * b * s * t * heads * d + SOFTMAX_FLOPS * b * heads * s * t + rotary


def _packed_attention(node: onnx.NodeProto, shape: ShapeOf) -> int | None:
    x, w, offsets = _input(node, shape, 0), _input(node, shape, 1), _input(node, shape, 3)
    if not x or not w or not offsets or len(offsets) != 2:
        return None
    tokens, d_in = x
    b, s = offsets  # token_offset (B, S): the padded length bounds each sequence's
    sizes = attr(node, "qkv_hidden_sizes", None) or [w[-1] // 3] * 3
    heads = attr(node, "num_heads", 1)
    return 2 * tokens * d_in * sum(sizes) + 2 * b * s * s * (sizes[0] + sizes[2]) + SOFTMAX_FLOPS * b * heads * s * s


def _matmul_nbits(node: onnx.NodeProto, shape: ShapeOf) -> int | None:
    a = _input(node, shape, 0)
    k, n = attr(node, "K", 0), attr(node, "N", 0)
    if not a or not k:
        return None
    m = math.prod(a) // k
    return 2 * m * n * k + (m * n if _input(node, shape, 5) else 0)


def _fused_matmul(node: onnx.NodeProto, shape: ShapeOf, out: Shape | None) -> int | None:
    a = _input(node, shape, 0)
    if not a or out is None or len(a) < 2:
        return None
    k = a[-2] if attr(node, "transA", 0) else a[-1]
    return 2 * math.prod(out) * k


def fused_flops(node: onnx.NodeProto, shape: ShapeOf) -> int | None:
    """FLOPs of a fused op (None: not one of those above, or its shapes are unknown)."""
    op = node.op_type
    out = shape(node.output[0]) if node.output and node.output[0] else None
    if op == "Attention":
        return _attention(node, shape)
    if op == "MultiHeadAttention":
        return _multi_head_attention(node, shape)
    if op == "GroupQueryAttention":
        return _group_query_attention(node, shape)
    if op == "PackedAttention":
        return _packed_attention(node, shape)
    if op == "MatMulNBits":
        return _matmul_nbits(node, shape)
    if op in ("FusedMatMul", "TransposeMatMul"):
        return _fused_matmul(node, shape, out)
    if op == "GemmFastGelu":
        gemm = _fused_matmul(node, shape, out)
        return None if gemm is None or out is None else gemm + PER_ELEMENT[op] * math.prod(out)
    if op in PER_ELEMENT and out is not None:
        return PER_ELEMENT[op] * math.prod(out)
    return None


def fused_gemm_dims(node: onnx.NodeProto, ins: list[Shape | None]) -> dict[str, int] | None:
    """The dims a fused op's Tensor Core kernel wants in multiples of 8 (None: unknown, or not
    assessed for this op)."""
    op = node.op_type
    if op == "MatMulNBits":
        return {"K": attr(node, "K", 0), "N": attr(node, "N", 0)}
    if op in ("FusedMatMul", "TransposeMatMul", "GemmFastGelu") and len(ins) > 1 and ins[0] and ins[1]:
        k = ins[0][-2] if attr(node, "transA", 0) else ins[0][-1]
        n = ins[1][-2] if attr(node, "transB", 0) else ins[1][-1]
        return {"K": k, "N": n}
    heads = attr(node, "num_heads", 0)
    q = ins[0] if ins else None
    if op == "Attention" and heads and len(ins) > 1 and ins[1]:
        sizes = attr(node, "qkv_hidden_sizes", None) or [ins[1][-1] // 3] * 3
        return {"head size": sizes[0] // heads}
    if op in ("MultiHeadAttention", "GroupQueryAttention") and heads and q and len(q) == 3:
        kv = attr(node, "kv_num_heads", 0) if op == "GroupQueryAttention" else 0
        packed = len(ins) < 2 or ins[1] is None
        return {"head size": q[2] // (heads + 2 * kv) if packed and kv else q[2] // heads}
    return None
