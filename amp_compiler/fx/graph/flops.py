"""Estimated FLOPs of the nodes of an FX graph, by the ONNX path's definitions (:mod:`amp_compiler.onnx.costs.costs`).

A multiply-add counts 2: matrix products ``2 * output elements * K`` (linear, mm, addmm, bmm,
baddbmm, matmul, ..., and the GEMM callables the caller names: the FP8 paths' own), convolutions
``2 * output elements * C_in/groups * kernel``, transposed convolutions ``2 * input elements *
C_out/groups * kernel``, einsum the product of all index sizes (times 2), scaled-dot-product
attention its two matrix products; other numeric ops one per output element; data movement (the
policy's PASS and NONFLOAT ops), casts, quantizers, placeholders, attributes and outputs none.
Which ops are matrix products or convolutions (matrix-vector products and dots included: ``mv``, ``dot``,
``linalg_vecdot``, no Tensor Core work), and which argument holds K or the weight, is the ATen table's
``gemm`` layout of each (:class:`~amp_compiler.policy.GemmLayout`). Shapes are the traced
``meta["val"]`` (symbolic sizes count as their hint).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Collection

import torch
import torch.fx as fx

from amp_compiler.core.einsum import einsum_flops
from amp_compiler.fx.graph.arguments import schema_argument, tensor_arguments
from amp_compiler.fx.graph.policy import AtenPolicy, op_name, policy_name
from amp_compiler.fx.graph.views import dim_hint
from amp_compiler.policy import Category, GemmKind, GemmLayout

__all__ = ["graph_flops", "node_flops"]


def _shape(node: object) -> tuple[int, ...] | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return tuple(dim_hint(d) for d in val.shape) if isinstance(val, torch.Tensor) else None


def _numel(node: object) -> int:
    shape = _shape(node)
    return math.prod(shape) if shape is not None else 0


def _outputs_numel(node: fx.Node) -> int:
    val = node.meta.get("val")
    vals = val if isinstance(val, (tuple, list)) else (val,)
    floats = [v for v in vals if isinstance(v, torch.Tensor) and v.is_floating_point()]
    return sum(math.prod(dim_hint(d) for d in v.shape) for v in floats)


def _arg(node: fx.Node, name: str) -> object:
    return schema_argument(node, name)[1]


def _matmul(node: fx.Node, gemm: GemmLayout) -> int:
    lhs = _shape(_arg(node, str(gemm.operands[0])))
    axis = _arg(node, gemm.k_axis) if gemm.k_axis is not None else -1  # linalg_vecdot's dim
    return 2 * _numel(node) * (lhs[axis] if lhs and isinstance(axis, int) and -len(lhs) <= axis < len(lhs) else 0)


def _conv(node: fx.Node, gemm: GemmLayout) -> int:
    data, weight = (str(name) for name in gemm.operands)
    w = _shape(_arg(node, weight))
    if w is None:
        return 0
    kernel = math.prod(w[2:])
    if gemm.kind is GemmKind.CONV_TRANSPOSE:  # weight [C_in, C_out/groups, k...]: every input element
        return 2 * _numel(_arg(node, data)) * w[1] * kernel  # meets C_out/groups * kernel weights
    return 2 * _numel(node) * w[1] * kernel  # weight [C_out, C_in/groups, k...]


def _einsum(node: fx.Node, gemm: GemmLayout) -> int:
    equation = _arg(node, "equation")
    operands = _arg(node, str(gemm.operands[0]))
    if not isinstance(equation, str) or not isinstance(operands, (list, tuple)):
        return _numel(node)
    flops = einsum_flops(equation, [_shape(op) for op in operands])
    return flops if flops is not None else _numel(node)


def _attention(node: fx.Node) -> int:
    q, k, v = (_shape(_arg(node, n)) for n in ("query", "key", "value"))
    if q is None or k is None or v is None:
        return _numel(node)
    heads = math.prod(q[:-2])
    return 2 * heads * q[-2] * k[-2] * (q[-1] + v[-1])


# FLOPs of a Tensor Core op by the kind of its product (the policy's ``gemm`` layout).
_BY_KIND: dict[GemmKind, Callable[[fx.Node, GemmLayout], int]] = {
    GemmKind.MATMUL: _matmul, GemmKind.CONV: _conv, GemmKind.CONV_TRANSPOSE: _conv, GemmKind.EINSUM: _einsum,
}


def node_flops(node: fx.Node, policy: AtenPolicy, gemms: Collection[Callable] = ()) -> int:
    """The node's estimated FLOPs (see module doc); ``gemms``: callables that multiply their first
    argument, [..., K], by a matrix (the FP8 GEMMs)."""
    if node.op != "call_function" or node.target is operator.getitem:
        return 0
    if node.target in gemms:
        return 2 * _numel(node) * ((_shape(node.args[0]) or (0,))[-1])
    name = op_name(node.target)
    if name is None:
        return 0
    key = policy_name(name)
    entry = policy.get(key)
    if entry is not None and entry.gemm is not None and entry.gemm.kind in _BY_KIND:
        return _BY_KIND[entry.gemm.kind](node, entry.gemm)
    if "scaled_dot_product" in key:
        return _attention(node)
    if entry is not None and entry.category in (Category.PASS, Category.NONFLOAT):
        return 0
    if entry is not None and entry.dtype_attr is not None:  # an explicit conversion
        return 0
    return _outputs_numel(node) if any(True for _ in tensor_arguments(node)) else 0


def graph_flops(gm: fx.GraphModule, policy: AtenPolicy, gemms: Collection[Callable] = ()) -> dict[str, int]:
    """FLOPs of every node, by node name (``gemms`` as for :func:`node_flops`)."""
    return {n.name: node_flops(n, policy, gemms) for n in gm.graph.nodes}
