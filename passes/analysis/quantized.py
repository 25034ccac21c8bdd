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

A statically quantized model's convolutions and matrix products read DequantizeLinear outputs: the
DQ -> product "node unit" that TensorRT's explicit quantization (and, for MatMul/Gemm, onnxruntime's
CPU QDQ transformer) fuse into an int8 kernel, with or without a QuantizeLinear after the product.
A Cast between a DQ and its product breaks the unit: the user's int8 product becomes an FP16 one on
dequantized values (measured on a CNN with two QDQ Convs and no Q after them: before this rule both
ran FP16 on ``DequantizeLinear -> Cast -> Conv`` for every provider). So:

- a Tensor Core op whose quantizable operands (the policy table's ``[op.gemm]`` operands) all come
  straight from DequantizeLinear, on a provider that fuses such a unit (``policy/qdq_units.toml``),
  keeps its DQs' output type, FP32, fixed (FIXED, rule ``quantized.product``: a fact of the provider's
  kernel, so it pulls no neighbour into FP32); where the provider runs the DQs and a float product
  apart, the product goes low as any other, and its decision says why (a note). Weight-only units
  (a DQ on the weight alone) are not units here (``qdq_units.toml`` says why).

The DequantizeLinears themselves are the policy table's: one of an activation (a QuantizeLinear's output)
is never touched (NONFLOAT: its scale is its QuantizeLinear's, which the first rule keeps FP32, and in a
fused unit the product keeps its FP32 output), one of a constant weight follows the products it feeds
(FOLLOW, its ``[[op.when]]`` case on constant inputs): low with a low product, its scale converted
offline, so a weight-only DQ feeds its FP16 MatMul with no Cast between (onnxruntime's MatMulNBits
fusion needs that), and FP32 with a fused unit's FIXED product.

Guarantees (checked by ``ensures``): every free vertex found by the first two rules, unless the user
forced it low (``user.allow``), is pinned to FP32 (DENY) with one of them and the quantizer in its
reason, every fused unit's product is FIXED by ``quantized.product``; nothing else changes.
"""

from __future__ import annotations

import dataclasses

import onnx_ir as ir

from amp_compiler.core.graph import PrecisionGraph, Vertex
from amp_compiler.core.plan import PrecisionPlan, Role, Rule
from amp_compiler.passes.analysis.base import AnalysisPass, ensure_all, require_roles
from amp_compiler.passes.analysis.classify import PINNABLE, ensure_pinned, pinnable, user_allowed
from amp_compiler.policy import default_table
from amp_compiler.policy.qdq_units import QdqUnitFact, qdq_unit_table
from amp_compiler.targets import Provider

__all__ = ["QuantizedIslandPass", "dequantized_products"]


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


def _dq_name(dq: Vertex) -> str:
    """A DequantizeLinear by its node's name, else by the tensor it writes."""
    if dq.node is not None and dq.node.name:
        return dq.describe()
    written = next((s.value.name for s in dq.slots if s.defines and s.value is not None), None)
    return f"the DequantizeLinear writing {written!r}"


def dequantized_products(graph: PrecisionGraph) -> dict[int, list[Vertex]]:
    """Per vertex of a Tensor Core op (the policy table's ``tensor_core``) whose quantizable operands (its
    ``[op.gemm]`` operands, else its first two inputs) all come straight from DequantizeLinear outputs:
    those DequantizeLinears' vertices, in operand order. A DQ -> product unit (see the module docstring)."""
    table = default_table()
    found: dict[int, list[Vertex]] = {}
    producers: dict[int, Vertex] = {}  # id of a tensor -> the vertex of the DequantizeLinear defining it
    for vertex in graph.vertices:
        if vertex.node is not None and vertex.node.op_type == "DequantizeLinear":
            for slot in vertex.slots:
                if slot.defines and slot.value is not None:
                    producers[id(slot.value)] = vertex
    if not producers:
        return found
    for node, vids in graph.node_vertices.items():
        if len(vids) != 1 or not table.is_tensor_core(node.domain or "ai.onnx", node.op_type):
            continue
        layout = table.gemm_layout(node.domain or "ai.onnx", node.op_type)
        operands = [i for i in layout.operands if isinstance(i, int)] if layout is not None else [0, 1]
        inputs = node.inputs
        if len(operands) < 2 or max(operands) >= len(inputs):
            continue
        dqs = [producers.get(id(inputs[i])) if inputs[i] is not None else None for i in operands]
        if all(dq is not None for dq in dqs):
            found[vids[0]] = [dq for dq in dqs if dq is not None]
    return found


@dataclasses.dataclass
class QuantizedIslandPass(AnalysisPass):
    """``provider``: whose fusion of DequantizeLinear -> product units decides ``quantized.product``."""

    provider: Provider = Provider.CUDA

    def requires(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        require_roles(self, graph, plan)

    def ensures(self, graph: PrecisionGraph, plan: PrecisionPlan, before: PrecisionPlan) -> None:
        units = self._fused_units(graph)
        pinned = {Rule.QUANTIZED_REQUANTIZE, Rule.QUANTIZED_SCALE}

        def kept_or_pinned(vertex: Vertex) -> bool:
            vid = vertex.id
            if plan.roles[vid] is before.roles[vid] and plan.role_rules[vid] == before.role_rules[vid]:
                return True
            rule, reason = plan.role_rules[vid]
            if not reason or before.roles[vid] not in PINNABLE:
                return False
            return (plan.roles[vid] is Role.DENY and rule in pinned) or (
                plan.roles[vid] is Role.FIXED and rule is Rule.QUANTIZED_PRODUCT and vid in units)

        ensure_all(self, graph.vertices, kept_or_pinned, "changed role, where only the quantized rules may")
        found = quantization_neighbours(graph)
        ensure_pinned(self, graph, plan, found, "feeds a quantizer or reads its scale")
        ensure_all(
            self, graph.vertices,
            lambda v: v.id not in units or before.roles[v.id] not in PINNABLE or user_allowed(plan, v.id)
            or plan.role_rules[v.id][0] is Rule.QUANTIZED_PRODUCT,
            "a fused DequantizeLinear -> product unit was left free",
        )

    def _fact(self, product: Vertex) -> QdqUnitFact | None:
        """What the provider does with a DQ -> ``product`` unit (None: no entry)."""
        node = product.node
        return qdq_unit_table().fact(self.provider, node.domain, node.op_type) if node is not None else None

    @staticmethod
    def _fused(fact: QdqUnitFact | None, dqs: list[Vertex]) -> bool:
        """A unit the provider fuses whose DQs all write FP32 (a DQ already writing FP16/BF16 needs no rule:
        its product goes low with it)."""
        return fact is not None and fact.fused and all(dq.dtype == ir.DataType.FLOAT for dq in dqs)

    def _fused_units(self, graph: PrecisionGraph) -> set[int]:
        """The product vertices of the DQ -> product units :meth:`_fused` keeps as they are."""
        return {vid for vid, dqs in dequantized_products(graph).items()
                if self._fused(self._fact(graph.vertices[vid]), dqs)}

    def call(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        self._units(graph, plan)
        for vid, (rule, q) in sorted(quantization_neighbours(graph).items()):
            if not pinnable(plan, vid):
                continue
            if rule is Rule.QUANTIZED_REQUANTIZE:
                why = (f"its result flows into {q.describe()}, which quantizes it: FP16 rounding before a "
                       "quantizer moves values across integer levels")
            else:
                why = (f"it reads the quantization scale of {q.describe()}: scale products of 1e-5 and below "
                       "are FP16 subnormals, and the int32 results they rescale exceed FP16's range")
            plan.set_role(vid, Role.DENY, rule, f"FP32: {why}")

    def _units(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        """DQ -> product units: fixed in the DQs' type where the provider fuses them, else a note that says
        why the product may go low."""
        for vid, dqs in sorted(dequantized_products(graph).items()):
            if not pinnable(plan, vid):
                continue
            names = ", ".join(dict.fromkeys(_dq_name(dq) for dq in dqs))
            fact = self._fact(graph.vertices[vid])
            if fact is not None and self._fused(fact, dqs):
                plan.set_role(vid, Role.FIXED, Rule.QUANTIZED_PRODUCT, (
                    f"int8 on {self.provider.value}, in the DequantizeLinear outputs' type (FP32) with no Cast "
                    f"between: its operands come straight from {names}, and {fact.reason}"))
            elif fact is not None and not fact.fused:
                note = f"its operands come from {names}, but {fact.reason}"
                plan.notes[vid] = f"{plan.notes[vid]}; {note}" if vid in plan.notes else note
