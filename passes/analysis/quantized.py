"""Quantized models: keep FP32 the float values that are quantized again and the quantization scales.

A model quantized dynamically (onnxruntime's ``quantize_dynamic``) computes in islands of float ops
between integer matrix products: DynamicQuantizeLinear quantizes an activation with a scale computed
from that tensor's range, MatMulInteger multiplies integers, a Cast and two Muls rescale the int32
result by the activation's and the weight's scales, and float ops (bias, LayerNorm, attention's own
MatMuls, Softmax, Gelu) run until the next DynamicQuantizeLinear. Rounding anywhere in an island to
FP16 moves values across int8 levels (each a 1/255 step of the tensor's range) at the next quantizer,
and the flips compound from layer to layer: measured on a two-layer encoder, FP16 in the attention
MatMuls alone moved its output probabilities by 0.5% of their range, with every value feeding a
quantizer kept FP32 as much as without; only the whole island in FP32 leaves them exact. So:

- what a quantizer reads, and for a dynamic quantizer everything upstream of it in its float island
  (back to the integer products, quantizers and graph inputs that bound it), stays FP32 (rule
  ``quantized.requantize``);
- what a quantizer's float outputs (its scale) feed stays FP32 (rule ``quantized.scale``): scale
  products of 1e-5 and below are FP16 subnormals, and the int32 results they rescale exceed 65504.

Guarantees (checked by ``ensures``): every free vertex so found, unless the user forced it low
(``user.allow``), is pinned to FP32 (DENY) with one of the two rules and the quantizer in its
reason; nothing else changes.
"""

from __future__ import annotations

import dataclasses

from amp_compiler.core.graph import PrecisionGraph, Vertex
from amp_compiler.core.plan import PrecisionPlan, Role, Rule
from amp_compiler.passes.analysis.base import AnalysisPass, ensure_all, ensure_only_pinned, require_roles
from amp_compiler.passes.analysis.classify import user_allowed

__all__ = ["QuantizedIslandPass"]

_PINNABLE = frozenset({Role.ALLOW, Role.INFER, Role.CLEAR})


def _quantizer(vertex: Vertex) -> str | None:
    """"static" or "dynamic" for a quantizer's vertex, else None."""
    return vertex.policy.quantizes if vertex.node is not None and vertex.policy is not None else None


def quantization_neighbours(graph: PrecisionGraph) -> dict[int, tuple[Rule, Vertex]]:
    """Per vertex upstream of a quantizer in its float island (``quantized.requantize``: just the one
    feeding it for a static quantizer) or reading its float outputs (``quantized.scale``): the rule
    and the quantizer."""
    found: dict[int, tuple[Rule, Vertex]] = {}
    pred, succ = graph.digraph.pred, graph.digraph.succ
    for q in graph.vertices:
        kind = _quantizer(q)
        if kind is None:
            continue
        for vid in succ[q.id]:
            found.setdefault(vid, (Rule.QUANTIZED_SCALE, q))
        stack = list(pred[q.id])
        while stack:
            vid = stack.pop()
            vertex = graph.vertices[vid]
            if vid in found or not vertex.free or _quantizer(vertex):
                continue
            found[vid] = (Rule.QUANTIZED_REQUANTIZE, q)
            if kind == "dynamic":
                stack.extend(pred[vid])
    return found


@dataclasses.dataclass
class QuantizedIslandPass(AnalysisPass):
    def requires(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        require_roles(self, graph, plan)

    def ensures(self, graph: PrecisionGraph, plan: PrecisionPlan, before: PrecisionPlan) -> None:
        rules = frozenset({Rule.QUANTIZED_REQUANTIZE, Rule.QUANTIZED_SCALE})
        ensure_only_pinned(self, graph, plan, before, _PINNABLE, Role.DENY, rules)
        found = quantization_neighbours(graph)
        ensure_all(
            self, graph.vertices,
            lambda v: v.id not in found or plan.roles[v.id] not in _PINNABLE or user_allowed(plan, v.id),
            "feeds a quantizer or reads its scale but was left free",
        )

    def call(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        for vid, (rule, q) in sorted(quantization_neighbours(graph).items()):
            if plan.roles[vid] not in _PINNABLE or user_allowed(plan, vid):
                continue
            if rule is Rule.QUANTIZED_REQUANTIZE:
                why = (f"its result flows into {q.describe()}, which quantizes it: FP16 rounding before a "
                       "quantizer moves values across integer levels")
            else:
                why = (f"it reads the quantization scale of {q.describe()}: scale products of 1e-5 and below "
                       "are FP16 subnormals, and the int32 results they rescale exceed FP16's range")
            plan.set_role(vid, Role.DENY, rule, f"FP32: {why}")
