"""TF32-proof FP32 products: a Tensor Core op kept in FP32 for its precision, written so that a GPU
reading FP32 products as TF32 (onnxruntime's CUDA provider and TensorRT, by default from Ampere on:
:mod:`amp_compiler.onnx.write.tf32`) still computes it to FP32's accuracy.

Each FP32 operand ``x`` of a MatMul, Gemm, Conv or ConvTranspose the pass is given is split into a
high part ``h = fp32(bf16(x))`` (a Cast round trip, rounded to nearest even in every runtime; a
constant's converted offline) and the rest ``l = x - h`` (exact in FP32). BF16 values have 8
significant bits, so TF32 reads ``h`` exactly, and ``l`` (at most 2^-9 of ``x``) within 2^-11 of itself:
each operand is read to within 2^-20 of its value instead of 2^-11. The op is bilinear in its two
operands, so ``op(x, w) = op(h_x, h_w) + op(h_x, l_w) + op(l_x, h_w) + op(l_x, l_w)``: four products of
the node's kind with its attributes (its bias, Gemm's ``C`` or a convolution's ``B``, in the first
only), summed in FP32, the small ones first. NVIDIA's 3xTF32 scheme, in ONNX, with the fourth product
kept because a BF16 split leaves ``l`` at 2^-9, not 2^-12. The node itself computes the first product;
the tensor its users read keeps its name, type and shape. On a runtime that computes FP32 products
exactly the sum is the product up to FP32's rounding of the four.

Cost: four products where there was one, each at TF32's rate (half FP16's) on Tensor Cores: 2x an FP16
product's time, against 16x for FP32 without Tensor Cores on an H100 (67 against 989 dense TFLOPS).
Nodes left as they are: a Gemm below opset 11 (its ``C`` is required), any node below opset 13 (no
BF16 Cast), operands that are not FP32. An infinite operand (or one beyond BF16's largest, 3.39e38)
has an infinite high part and a NaN rest: the split product is NaN where FP32's may be infinite.
Checked under exact emulation on a CPU; no GPU has run it yet (its speed, and that TensorRT keeps the
lossy Cast round trip, which it must in a strongly typed network, are unmeasured).

Guarantees (``ensures``): every split node's operands are BF16-exact high parts or FP32 remainders; every
tensor the rest of the graph reads keeps its name and type; graph inputs and outputs are unchanged.
"""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import onnx_ir as ir

from amp_compiler.core.plan import Rule
from amp_compiler.dtypes import short_name
from amp_compiler.onnx.ir.constants import constant_array
from amp_compiler.onnx.ir.walk import home_graph, is_constant
from amp_compiler.passes.onnx.lower import _Names, cast_to

__all__ = ["SPLIT_OPS", "SPLIT_PRODUCTS", "SplitNode", "SplitProductsPass"]

_FP32, _BF16 = ir.DataType.FLOAT, ir.DataType.BFLOAT16
#: The ops the pass splits, with the inputs that are their two operands and the one added after the
#: product (their bias), by ONNX's definitions.
SPLIT_OPS = {"MatMul": ((0, 1), None), "Gemm": ((0, 1), 2), "Conv": ((0, 1), 2), "ConvTranspose": ((0, 1), 2)}
#: The products a split node computes in place of one.
SPLIT_PRODUCTS = 4
_BF16_CAST_OPSET = 13  # Cast takes bfloat16 from opset 13
_GEMM_OPTIONAL_C = 11  # Gemm's C is optional from opset 11


@dataclasses.dataclass
class SplitNode:
    """A node the pass split, and the nodes it inserted around it (the three other products included)."""

    node: ir.Node
    inserted: list[ir.Node]
    operands: list[str]  # the names of its two operands, as they were


class SplitProductsPass(ir.passes.InPlacePass):
    """Write ``nodes`` (FP32 Tensor Core ops of the lowered model) as TF32-proof split products (module doc)."""

    def __init__(self, nodes: list[ir.Node]):
        super().__init__()
        self.nodes = nodes
        self.split: list[SplitNode] = []
        self.positions: set[int] = set()  # the split nodes' positions in the input model (explain)
        self._model: ir.Model | None = None

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        self._model = model
        names = _Names(model)
        opset = model.opset_imports.get("", 1)
        parts: dict[int, tuple[ir.Value, ir.Value, list[ir.Node]]] = {}  # id(value) -> its (high, low, nodes)
        for node in self.nodes:
            if self.splittable(node, opset):
                self.split.append(self._split(node, names, parts))
        return ir.passes.PassResult(model, bool(self.split))

    @staticmethod
    def splittable(node: ir.Node, opset: int) -> bool:
        """Whether the pass splits ``node`` in a model of this default-domain ``opset``."""
        if node.domain not in ("", "ai.onnx") or node.op_type not in SPLIT_OPS or opset < _BF16_CAST_OPSET:
            return False
        if node.op_type == "Gemm" and opset < _GEMM_OPTIONAL_C:
            return False
        (a, b), _ = SPLIT_OPS[node.op_type]
        operands = [node.inputs[i] if i < len(node.inputs) else None for i in (a, b)]
        return all(v is not None and v.dtype == _FP32 for v in operands) and all(
            o.dtype == _FP32 for o in node.outputs)

    def _parts(self, value: ir.Value, graph: ir.Graph, before: ir.Node, names: _Names,
               parts: dict) -> tuple[ir.Value, ir.Value, list[ir.Node]]:
        """``value``'s high and low parts (made once per value), and the nodes that make them."""
        if id(value) in parts:
            return parts[id(value)][0], parts[id(value)][1], []
        stem = value.name or "operand"
        if is_constant(value):
            array = np.asarray(constant_array(value), dtype=np.float32)
            rounded = array.astype(ml_dtypes.bfloat16).astype(np.float32)
            made = []
            for tag, values in (("tf32_high", rounded), ("tf32_low", array - rounded)):
                name = names.fresh(f"{stem}_{tag}")
                v = ir.Value(name=name, type=ir.TensorType(_FP32), shape=ir.Shape(list(values.shape)),
                             const_value=ir.tensor(values, name=name))
                graph.register_initializer(v)
                made.append(v)
            parts[id(value)] = (made[0], made[1], [])
            return made[0], made[1], []
        assert self._model is not None
        bf16 = ir.Value(name=names.fresh(f"{stem}_bf16"), type=ir.TensorType(_BF16), shape=value.shape)
        high = ir.Value(name=names.fresh(f"{stem}_tf32_high"), type=ir.TensorType(_FP32), shape=value.shape)
        low = ir.Value(name=names.fresh(f"{stem}_tf32_low"), type=ir.TensorType(_FP32), shape=value.shape)
        label = before.name or before.op_type
        nodes = [
            ir.Node("", "Cast", [value], attributes=[cast_to(self._model, _BF16)], outputs=[bf16],
                    name=names.fresh(f"{label}/tf32_split_cast")),
            ir.Node("", "Cast", [bf16], attributes=[cast_to(self._model, _FP32)], outputs=[high],
                    name=names.fresh(f"{label}/tf32_split_cast_back")),
            ir.Node("", "Sub", [value, high], outputs=[low], name=names.fresh(f"{label}/tf32_split_low")),
        ]
        parts[id(value)] = (high, low, nodes)
        return high, low, nodes

    def _split(self, node: ir.Node, names: _Names, parts: dict) -> SplitNode:
        graph = home_graph(node)
        (a, b), bias = SPLIT_OPS[node.op_type]
        label = node.name or node.op_type
        first, second = node.inputs[a], node.inputs[b]
        assert first is not None and second is not None
        operands = [first, second]
        before: list[ir.Node] = []
        (ha, la, made_a), (hb, lb, made_b) = (self._parts(v, graph, node, names, parts) for v in operands)
        before += made_a + made_b
        others = [v for i, v in enumerate(node.inputs) if i not in (a, b) and i != bias]
        assert not others, f"{node.op_type} takes its operands and bias only"
        output = node.outputs[0]
        users = ir.Value(type=ir.TensorType(_FP32), shape=output.shape)
        ir.convenience.replace_all_uses_with(output, users, replace_graph_outputs=True)
        out_name = output.name or ""
        output.name = names.fresh(f"{out_name}_tf32_high_high")
        node.replace_input_with(a, ha)
        node.replace_input_with(b, hb)
        after: list[ir.Node] = []
        small: ir.Value | None = None
        for tag, (x, w) in (("low_low", (la, lb)), ("high_low", (ha, lb)), ("low_high", (la, hb))):
            inputs = [x, w]
            product = ir.Value(name=names.fresh(f"{out_name}_tf32_{tag}"), type=ir.TensorType(_FP32),
                               shape=output.shape)
            attributes = [ir.Attr(attr.name, attr.type, attr.value) for attr in node.attributes.values()]
            after.append(ir.Node("", node.op_type, inputs, attributes=attributes,
                                 outputs=[product], name=names.fresh(f"{label}/tf32_{tag}")))
            if small is None:
                small = product
                continue
            total = ir.Value(name=names.fresh(f"{out_name}_tf32_sum"), type=ir.TensorType(_FP32), shape=output.shape)
            after.append(ir.Node("", "Add", [small, product], outputs=[total], name=names.fresh(f"{label}/tf32_sum")))
            small = total
        assert small is not None
        users.name = out_name
        after.append(ir.Node("", "Add", [output, small], outputs=[users], name=names.fresh(f"{label}/tf32_sum")))
        if before:
            graph.insert_before(node, before)
        graph.insert_after(node, after)
        return SplitNode(node, before + after, [v.name or "" for v in operands])

    def explain(self, decisions: list, nodes: list[ir.Node]) -> None:
        """Describe the split in the conversion's decisions (``decisions[i]`` is ``nodes[i]``'s): a split node
        stays FP32 under its rule, which its reason says is now TF32-proof; the nodes around it say whose
        they are (rule ``tf32.split``)."""
        by_node = {id(s.node): s for s in self.split}
        by_inserted = {id(n): s for s in self.split for n in s.inserted}
        for decision, node in zip(decisions, nodes, strict=False):
            s = by_node.get(id(node))
            if s is not None:
                if decision.index is not None:
                    self.positions.add(decision.index)
                decision.reason = (
                    f"FP32 written TF32-proof (--fp32-products split): {s.operands[0]!r} and {s.operands[1]!r} "
                    f"each split into a BF16-exact high part and the rest, four products summed in FP32; "
                    f"{decision.reason}")
                continue
            s = by_inserted.get(id(node))
            if s is None:
                continue
            dtype = node.outputs[0].dtype
            decision.precision = short_name(dtype) if dtype is not None else "?"
            decision.rule = Rule.TF32_SPLIT.value
            decision.reason = f"{node.op_type} inserted: the TF32-proof split of {s.node.name or s.node.op_type!r}"

    def ensures(self, model: ir.Model) -> None:
        """Every split node reads BF16-exact high parts: a constant's values, or a Cast back from BF16."""
        for s in self.split:
            (a, b), _ = SPLIT_OPS[s.node.op_type]
            for i in (a, b):
                value = s.node.inputs[i]
                assert value is not None and value.dtype == _FP32, f"{s.node.name}: operand {i} is not FP32"
                producer = value.producer()
                if producer is not None:
                    source = producer.inputs[0] if producer.inputs else None
                    exact = producer.op_type == "Cast" and source is not None and source.dtype == _BF16
                else:
                    values = np.asarray(constant_array(value), np.float32)
                    exact = np.array_equal(values.astype(ml_dtypes.bfloat16).astype(np.float32), values)
                assert exact, f"{s.node.name}: operand {i} is not a BF16-exact high part"
