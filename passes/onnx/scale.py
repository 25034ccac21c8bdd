"""Range scaling, lowered: run the plan's scaled Tensor Core ops in FP16 on power-of-two scaled operands.

For each vertex in :attr:`~amp_compiler.core.plan.PrecisionPlan.scalings` (chosen by
:class:`~amp_compiler.passes.analysis.range_scaling.RangeScalingPass`; lowering left the node FP32, as
its neighbours see it), on the lowered model:

- a constant operand (or bias) shifted by k is replaced by a new FP16 constant holding its values times
  2^-k (converted offline; the FP32 constant stays for its other users, and goes where it has none);
- an activation operand is multiplied by 2^-k in FP32 (no Mul where k is 0) and Cast to FP16;
- the node's output becomes FP16 and is Cast back to FP32 and multiplied by 2^output there: the
  tensor its users and the graph's outputs read keeps its name, type and shape.

Per channel (a MatMul or Gemm whose :class:`~amp_compiler.core.plan.Scaling` has ``inputs`` and
``outputs``): the activation is multiplied by the FP32 vector 2^-inputs along its last axis, the
weight's entries by 2^(inputs[k] - outputs[n]) offline (as the node stores it: a Gemm's ``transB``),
a Gemm's bias by 2^-outputs, and the product by the vector 2^outputs after the Cast back.

Powers of two are exact, so the node computes what the FP32 node did up to FP16's rounding of its
operands and product (and the values the analysis judged pushed below FP16's normals). A Cast from
FP16 to FP32 that lowering put before an unshifted operand cancels against the new Cast to FP16
(:class:`~amp_compiler.passes.onnx.cleanup.RemoveCancellingCastsPass`, which runs next).

Guarantees: only the scaled nodes change; every tensor their neighbours read keeps its name and type;
graph inputs and outputs are unchanged.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir

from amp_compiler.core.plan import PrecisionPlan, Rule, Scaling
from amp_compiler.dtypes import short_name
from amp_compiler.onnx.graph.precision_graph import OnnxPrecisionGraph
from amp_compiler.onnx.ir.constants import constant_array
from amp_compiler.onnx.ir.walk import home_graph, is_constant
from amp_compiler.passes.onnx.lower import _Names, cast_to

__all__ = ["ScaledNode", "ScaledProductsPass", "scaling_reason"]

_FP16, _FP32 = ir.DataType.FLOAT16, ir.DataType.FLOAT


@dataclasses.dataclass
class ScaledNode:
    """A node the pass scaled, its scaling, and the nodes it inserted around it."""

    node: ir.Node
    scaling: Scaling
    inserted: list[ir.Node]
    operands: dict[int, str]  # the names of the inputs it shifted, as they were


def scaling_reason(scaling: Scaling, operands: dict[int, str]) -> str:
    """What the scaling does, in a sentence (the node's decision starts with it); ``operands``: the
    shifted inputs' names by index."""
    parts = [f"{operands.get(i) or f'input {i}'!r} x 2^-{k}" for i, k in sorted(scaling.shifts.items()) if k]
    if scaling.per_channel:
        parts = [f"{operands.get(0) or 'input 0'!r} per channel ({_channels(scaling.inputs)})",
                 f"the product per channel ({_channels(scaling.outputs)}), the weight by both"]
        return (
            f"FP16 on Tensor Cores with power-of-two scales per channel, not FP32 (range scaling: exact but for "
            f"values pushed below FP16's normals, which cost them no more than BF16 would): {'; '.join(parts)}; "
            f"the product's channels unscaled in FP32 after it; the scaled values stay {scaling.headroom:.3g}x "
            f"below FP16's largest"
        )
    shifted = ", ".join(parts) if parts else "no operand shifted"
    return (
        f"FP16 on Tensor Cores with power-of-two scales, not FP32 (range scaling: exact but for values pushed "
        f"below FP16's normals, which cost them no more than BF16 would): {shifted}; the product x "
        f"2^{scaling.output} in FP32 after it; the scaled values stay {scaling.headroom:.3g}x below FP16's largest"
    )


def _channel_exponents(node: ir.Node, inputs: np.ndarray, outputs: np.ndarray) -> dict[int, np.ndarray]:
    """Per input index of a MatMul or Gemm scaled per channel, the powers of two its values are multiplied
    by: the activation's channels 2^-a, the weight's entries 2^(a_k - c_n) (as a Gemm's ``transB``
    stores it), a Gemm's bias 2^-c along the product's channels."""
    weight = inputs[:, None] - outputs[None, :]
    trans_b: int = node.attributes.get_int("transB", 0)
    if node.op_type == "Gemm" and trans_b:
        weight = weight.T
    return {0: -inputs, 1: weight, 2: -outputs}


def _channels(shifts: tuple[int, ...], shown: int = 4) -> str:
    """The shifted channels of a per-channel scaling, e.g. "3 x 2^-9, 17 x 2^-9"."""
    moved = [(c, k) for c, k in enumerate(shifts) if k]
    if not moved:
        return "none shifted"
    text = ", ".join(f"{c} x 2^-{k}" for c, k in moved[:shown])
    return text + (f" and {len(moved) - shown} more" if len(moved) > shown else "") + f" of {len(shifts)}"


def _drop_if_unused(value: ir.Value) -> None:
    """Remove a constant nothing reads any more (an initializer, or a Constant node's output): its
    scaled FP16 copy replaced it. A graph input or output stays."""
    if value.uses() or value.is_graph_output() or value.is_graph_input():
        return
    producer = value.producer()
    if producer is not None:
        home_graph(producer).remove(producer, safe=True)
    elif value.graph is not None and value.name is not None and value.name in value.graph.initializers:
        value.graph.initializers.pop(value.name)


class ScaledProductsPass(ir.passes.InPlacePass):
    """Apply the plan's scalings to the lowered model (see the module docstring)."""

    def __init__(self, graph: OnnxPrecisionGraph, plan: PrecisionPlan):
        super().__init__()
        self.graph = graph
        self.plan = plan
        self.scaled: list[ScaledNode] = []
        self._model: ir.Model | None = None  # the model ``call`` scales (Cast's ``to`` follows its opset)

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        names = _Names(model)
        self._model = model
        factors: dict[tuple[int, int], ir.Value] = {}  # (graph id, shift) -> its FP32 scalar 2^shift
        for vid, scaling in self.plan.scalings.items():
            node = self.graph.vertices[vid].node
            assert isinstance(node, ir.Node)
            self.scaled.append(self._scale(node, scaling, names, factors))
        return ir.passes.PassResult(model, bool(self.scaled))

    def _cast_to(self, dtype: ir.DataType) -> ir.Attr:
        assert self._model is not None
        return cast_to(self._model, dtype)

    def _factor(self, graph: ir.Graph, shift: int, names: _Names, factors: dict) -> ir.Value:
        key = (id(graph), shift)
        if key not in factors:
            name = names.fresh(f"range_scale_2pow{shift}")
            value = ir.Value(name=name, type=ir.TensorType(_FP32), shape=ir.Shape([]),
                             const_value=ir.tensor(np.array(2.0**shift, np.float32), name=name))
            graph.register_initializer(value)
            factors[key] = value
        return factors[key]

    @staticmethod
    def _channel_factor(graph: ir.Graph, exponents: np.ndarray, names: _Names) -> ir.Value:
        """A new FP32 initializer of 2^exponents, one per channel of a last axis."""
        name = names.fresh("range_scale_channels")
        value = ir.Value(name=name, type=ir.TensorType(_FP32), shape=ir.Shape([exponents.size]),
                         const_value=ir.tensor(np.exp2(exponents).astype(np.float32), name=name))
        graph.register_initializer(value)
        return value

    def _scale(self, node: ir.Node, scaling: Scaling, names: _Names, factors: dict) -> ScaledNode:
        graph = home_graph(node)
        operands = {i: (v.name or "") for i in scaling.shifts if (v := node.inputs[i]) is not None}
        before: list[ir.Node] = []
        label = node.name or node.op_type
        channel_in = np.array(scaling.inputs, np.float64)
        channel_out = np.array(scaling.outputs, np.float64)
        per_channel = _channel_exponents(node, channel_in, channel_out) if scaling.per_channel else {}
        for i, k in scaling.shifts.items():
            value = node.inputs[i]
            assert value is not None
            if is_constant(value):
                array = np.asarray(constant_array(value), dtype=np.float32)
                product = array * (np.exp2(per_channel[i]) if scaling.per_channel else np.float32(2.0**-k))
                tag = "_channel_scaled" if scaling.per_channel else (f"_shift{k}" if k else "")
                name = names.fresh(f"{value.name}_fp16{tag}")
                scaled = ir.Value(name=name, type=ir.TensorType(_FP16), shape=ir.Shape(list(product.shape)),
                                  const_value=ir.tensor(product.astype(np.float16), name=name))
                graph.register_initializer(scaled)
                node.replace_input_with(i, scaled)
                _drop_if_unused(value)
                continue
            source = value
            if scaling.per_channel:
                by = self._channel_factor(graph, per_channel[i], names) if per_channel[i].any() else None
            else:
                by = self._factor(graph, -k, names, factors) if k else None
            if by is not None:
                tag = "shifted" if scaling.per_channel else f"shift{k}"
                shifted = ir.Value(name=names.fresh(f"{value.name}_{tag}"), type=ir.TensorType(_FP32),
                                   shape=value.shape)
                before.append(ir.Node("", "Mul", [value, by], outputs=[shifted],
                                      name=names.fresh(f"{label}/scale_input{i}")))
                source = shifted
            low = ir.Value(name=names.fresh(f"{source.name}_fp16"), type=ir.TensorType(_FP16), shape=value.shape)
            before.append(ir.Node("", "Cast", [source], attributes=[self._cast_to(_FP16)], outputs=[low],
                                  name=names.fresh(f"{label}/cast_input{i}")))
            node.replace_input_with(i, low)
        output = node.outputs[0]
        users = ir.Value(type=ir.TensorType(_FP32), shape=output.shape)
        ir.convenience.replace_all_uses_with(output, users, replace_graph_outputs=True)
        out_name = output.name or ""
        output.name = names.fresh(f"{out_name}_fp16_shift{scaling.output}")
        output.type = ir.TensorType(_FP16)
        users.name = out_name
        after: list[ir.Node] = []
        if scaling.per_channel:
            unscale = self._channel_factor(graph, channel_out, names) if channel_out.any() else None
        else:
            unscale = self._factor(graph, scaling.output, names, factors) if scaling.output else None
        tag = "shifted" if scaling.per_channel else f"shift{scaling.output}"
        cast_out = users if unscale is None else ir.Value(
            name=names.fresh(f"{out_name}_{tag}"), type=ir.TensorType(_FP32), shape=output.shape)
        after.append(ir.Node("", "Cast", [output], attributes=[self._cast_to(_FP32)], outputs=[cast_out],
                             name=names.fresh(f"{label}/cast_output")))
        if unscale is not None:
            after.append(ir.Node("", "Mul", [cast_out, unscale], outputs=[users],
                                 name=names.fresh(f"{label}/unscale_output")))
        if before:
            graph.insert_before(node, before)
        graph.insert_after(node, after)
        return ScaledNode(node, scaling, before + after, operands)

    def explain(self, decisions: list, nodes: list[ir.Node]) -> None:
        """Describe the scaling in the conversion's decisions (``decisions[i]`` is ``nodes[i]``'s, made from
        the scaled model, their types read from it): a scaled node runs in FP16, the Muls and Casts
        around it say whose they are."""
        by_node = {id(s.node): s for s in self.scaled}
        by_inserted = {id(n): s for s in self.scaled for n in s.inserted}
        for decision, node in zip(decisions, nodes, strict=False):
            s = by_node.get(id(node))
            if s is not None:
                decision.precision = short_name(_FP16)
                decision.reason = f"{scaling_reason(s.scaling, s.operands)}; {decision.reason}"
                continue
            s = by_inserted.get(id(node))
            if s is None:
                continue
            label = s.node.name or s.node.op_type
            dtype = node.outputs[0].dtype
            decision.precision = short_name(dtype) if dtype is not None else "?"
            if node.op_type == "Cast":
                decision.rule = Rule.LOWERING_CAST.value
                decision.reason = f"Cast inserted: range scaling runs {label!r} in FP16"
            else:
                decision.rule = Rule.RANGE_SCALE.value
                decision.reason = f"Mul inserted: a power-of-two scale of range scaling around {label!r} (exact)"
