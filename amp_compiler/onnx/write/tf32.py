"""What a GPU does with the FP32 matrix products a conversion keeps for their precision: TF32.

From Ampere on, onnxruntime's CUDA provider (``use_tf32``, on unless set to 0) and TensorRT
(``BuilderFlag.TF32``, on unless cleared) run FP32 MatMul, Gemm and convolutions on Tensor Cores as
TF32: each operand is read at 10 mantissa bits, FP16's precision, and the products accumulate in
FP32. A Tensor Core op kept in FP32 because FP16's precision is not enough for it (a signal path into
a Log, a product before a quantizer, a ``--tolerance`` pin, a node the user blocked) then gets FP16's
operand rounding back, and on the catalog that undoes the rule whole: ``cqt-log``'s three Convs kept
FP32 give a relative L2 error of 2.4e-4 exact and 2.0e-2 read as TF32, what FP16 gives them;
``quantized-encoder``'s four MatMuls 0 and 9.1e-3 (8.2e-3 in FP16). Nodes kept FP32 for their range
only lose nothing: TF32 has FP32's range. ONNX cannot say "no TF32", so the conversion says it
(:func:`tf32_warnings`), ``compare --tf32`` measures it (:func:`amp_compiler.onnx.measure.emulate.emulate`)
and ``--fp32-products split`` writes them TF32-proof (:mod:`amp_compiler.passes.onnx.split_products`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

import onnx
import onnx.shape_inference
import onnx_ir as ir

from amp_compiler.core.decision import NodeDecision
from amp_compiler.core.plan import RANGE_ONLY_RULES, PrecisionPlan, Rule
from amp_compiler.onnx.graph.precision_graph import OnnxPrecisionGraph
from amp_compiler.policy import default_table
from amp_compiler.targets import Provider

__all__ = [
    "TF32_PROVIDERS", "fp32_products", "fp32_products_warnings", "kept_for_precision",
    "tf32_warnings",
]

#: The providers that run FP32 Tensor Core ops as TF32 by default (on Ampere and later GPUs).
TF32_PROVIDERS = frozenset({Provider.CUDA, Provider.TENSORRT})
#: Rules that keep a product FP32 for no precision of its own: its range (TF32 has FP32's), no low type
#: for it (its schema at the model's opset, an unknown type, no provider kernel: FP32 is all it has, and
#: TF32 undoes no choice), or an int8 unit the provider fuses with its DequantizeLinears (quantized.product:
#: TF32 has no say, and a TF32-proof split would break the unit). The others keep it FP32 for its precision.
_NOT_FOR_PRECISION = RANGE_ONLY_RULES | {Rule.FIXED, Rule.UNKNOWN_TYPE, Rule.PROVIDER_NO_KERNEL, Rule.QUANTIZED_PRODUCT}
_NOT_FOR_PRECISION_IDS = frozenset(rule.value for rule in _NOT_FOR_PRECISION)
_NAMED = 3  # nodes named in the warning; the rest counted


def kept_for_precision(graph: OnnxPrecisionGraph, plan: PrecisionPlan) -> list[ir.Node]:
    """The main graph's Tensor Core ops the plan keeps in FP32 for their precision: any rule but
    :data:`_NOT_FOR_PRECISION` (what :func:`tf32_warnings` names, and ``--fp32-products split`` splits),
    and a kernel for their final types on the provider (``plan.no_kernel``: no FP32 kernel, no TF32)."""
    table = default_table()
    out = []
    for node, vids in graph.node_vertices.items():
        if not isinstance(node, ir.Node) or node.graph is not graph.model.graph or len(vids) != 1:
            continue
        if node in plan.no_kernel:
            continue
        decision = plan.decisions[vids[0]]
        if (decision.dtype == ir.DataType.FLOAT and decision.rule not in _NOT_FOR_PRECISION
                and table.is_tensor_core(node.domain or "ai.onnx", node.op_type)):
            out.append(node)
    return out


def fp32_products(model: onnx.ModelProto) -> list[str]:
    """The names (else op types) of the main graph's Tensor Core ops of ``model`` (any tool's) whose first
    operand is FP32, by onnx's shape inference and the graph's declared types: what a GPU reads as TF32."""
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    graph = inferred.graph
    types = {v.name: v.type.tensor_type.elem_type for v in (*graph.input, *graph.value_info, *graph.output)}
    types.update({t.name: t.data_type for t in graph.initializer})
    table = default_table()
    return [node.name or node.op_type for node in graph.node
            if table.is_tensor_core(node.domain or "ai.onnx", node.op_type) and node.input
            and types.get(node.input[0]) == onnx.TensorProto.FLOAT]


def fp32_products_warnings(model: onnx.ModelProto, name: str) -> list[str]:
    """One line when ``model`` (any tool's, called ``name``) has FP32 matrix products (:func:`fp32_products`)
    that an exact emulation measured as FP32: what ``compare`` says without ``--tf32``."""
    kept = fp32_products(model)
    if not kept:
        return []
    return [f"{len(kept)} matrix product(s) of {name} are FP32 ({_listed(kept)}), measured exact here: GPUs from "
            f"Ampere on read them as TF32 by default (FP16's operand precision); --tf32 measures that"]


def _listed(names: list[str]) -> str:
    """The first :data:`_NAMED` of ``names``, and how many more."""
    return ", ".join(names[:_NAMED]) + (f" and {len(names) - _NAMED} more" if len(names) > _NAMED else "")


def tf32_warnings(decisions: Iterable[NodeDecision], provider: Provider, proof: Collection[int] = (),
                  no_kernel: Collection[int] = ()) -> list[str]:
    """One line when ``provider`` reads FP32 products as TF32 by default and the conversion keeps Tensor
    Core ops in FP32 for their precision (any rule but :data:`_NOT_FOR_PRECISION`) that it did not write
    TF32-proof (``proof``: the positions of those it did) and that have a kernel in their types on the
    provider (``no_kernel``: the positions of those without, GroupQueryAttention in FP32 on CUDA: nothing
    runs them as TF32, the final kernel check warns of them): which, why, and what to do."""
    if provider not in TF32_PROVIDERS:
        return []
    table = default_table()
    skipped = set(proof) | set(no_kernel)
    kept = [d for d in decisions if d.precision == "fp32" and d.rule not in _NOT_FOR_PRECISION_IDS
            and table.is_tensor_core(d.domain, d.op_type) and d.index is not None and d.index not in skipped]
    if not kept:
        return []
    names = _listed([d.node or f"{d.op_type} #{d.index}" for d in kept])  # unnamed: its position
    rules = ", ".join(dict.fromkeys(d.rule for d in kept))
    products = "product" if len(kept) == 1 else "products"
    return [
        f"{len(kept)} matrix {products} kept in FP32 for precision ({names}: {rules}) run as TF32 by default on "
        f"Ampere and later GPUs, which reads their operands at FP16's precision and undoes that: run them with "
        f"TF32 off (onnxruntime: use_tf32=0; TensorRT: without BuilderFlag.TF32), write them TF32-proof with "
        f"--fp32-products split, or measure what it costs with `amp-compiler compare --tf32`"
    ]
