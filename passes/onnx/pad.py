"""Tensor Core padding (opt-in): pad low-precision MatMul/Gemm/Conv weights to multiples of 8, exactly.

FP16/BF16 Tensor Core kernels want the GEMM dims in multiples of 8 (``amp_compiler.onnx.costs.costs`` reports
them per node). Where the *output* dim of a constant weight is not, it is padded with zeros and a
Slice drops the extra outputs again:

- MatMul ``A @ W`` (W constant, rank >= 2): N, W's last axis, gets zero columns; Slice the last axis.
- Gemm (B constant): N gets zero columns of B (rows with ``transB``), a constant bias C with an N
  axis gets zeros; Slice the last axis.
- Conv / ConvTranspose (``group == 1``, constant weight): C_out gets zero filters and the bias
  zeros; Slice axis 1 (channels).

Which ops these are, and which input and axis of each holds N (C_out) and K (C_in), is the policy
table's ``gemm`` layout of the op (:class:`~amp_compiler.policy.GemmLayout`).

Each kept output is computed from the same weights as before (an output column depends on its own
weight column only), so the values are those of the unpadded op up to the kernel's summation order;
the extra outputs are exact zeros that the Slice drops. The reduction dim (K, C_in) is left alone:
padding it needs a zero-padded copy of the activation at run time, and a node is only padded when its
reduction dim already is a multiple of 8 (otherwise padding N alone would not make it eligible).
Grouped convolutions are left alone: padding each group would interleave zero filters, which a Slice
cannot drop.

Runs on the lowered model (only nodes whose data input is FP16/BF16 are padded). Guarantees: graph
inputs, outputs and their names are unchanged (the Slice's output takes the original name); weights
shared with another user are copied, not changed in place.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np
import onnx_ir as ir

from amp_compiler.core.plan import Rule
from amp_compiler.dtypes import short_name
from amp_compiler.onnx.ir.constants import constant_array
from amp_compiler.onnx.ir.walk import is_constant, iter_graphs
from amp_compiler.passes.onnx.lower import _Names
from amp_compiler.policy import GemmKind, PolicyTable, default_table

__all__ = ["PadTensorCoresPass", "Padding"]

LOW = (ir.DataType.FLOAT16, ir.DataType.BFLOAT16)
_PADDED = (GemmKind.MATMUL, GemmKind.CONV, GemmKind.CONV_TRANSPOSE)  # a weight whose N (C_out) axis can grow


@dataclasses.dataclass
class Padding:
    node: ir.Node
    dim: str  # "N" or "C_out"
    before: int
    after: int
    slice: ir.Node
    renamed: tuple[str | None, str | None]  # (the padded output's new name, the name the Slice's output took over)


class _PadPlan(NamedTuple):
    """Where to pad a node: the weight (its input) and its padded axis, the bias's input (None: no bias
    to pad), the output axis the Slice cuts, the dim's name and its size."""

    weight: int
    w_axis: int
    bias: int | None
    out_axis: int
    dim: str
    n: int


def _int_attr(node: ir.Node, name: str, default: int) -> int:
    attr = node.attributes.get(name)
    return attr.as_int() if attr is not None else default


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


class PadTensorCoresPass(ir.passes.InPlacePass):
    def __init__(self, multiple: int = 8, policy: PolicyTable | None = None):
        super().__init__()
        self.multiple = multiple
        self.policy = policy or default_table()  # where the ops' weights hold N (or C_out) and K (or C_in)
        self.paddings: list[Padding] = []

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        names = _Names(model)
        opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 1))
        for graph in list(iter_graphs(model.graph)):
            for node in list(graph):
                plan = self._plan(node)
                if plan is not None:
                    self._apply(graph, node, plan, names, opset)
        return ir.passes.PassResult(model, bool(self.paddings))

    # -- what to pad -----------------------------------------------------------------------------
    def _plan(self, node: ir.Node) -> _PadPlan | None:
        """Where to pad the node, or None when it is not padded."""
        gemm = self.policy.gemm_layout(node.domain, node.op_type)
        if gemm is None or gemm.kind not in _PADDED:
            return None
        data, w = (int(i) for i in gemm.operands)
        if len(node.inputs) <= w:
            return None
        activation, weight = node.inputs[data], node.inputs[w]
        if activation is None or activation.dtype not in LOW:
            return None
        if weight is None or not is_constant(weight) or weight.dtype not in LOW:
            return None
        shape = weight.shape
        if shape is None or not shape.is_static() or len(shape) < 2:
            return None
        dims = list(shape.numpy())
        if gemm.kind is GemmKind.MATMUL:
            transposed = bool(gemm.transpose and _int_attr(node, gemm.transpose[1], 0))
            k_axis, w_axis = gemm.weight_axes(len(dims), transposed)
            out_axis, dim = -1, "N"
        else:
            if _int_attr(node, "group", 1) != 1:
                return None
            k_axis, w_axis = gemm.weight_axes(len(dims))
            out_axis, dim = 1, "C_out"
        k, n = dims[k_axis], dims[w_axis]
        if n % self.multiple == 0 or k % self.multiple != 0:
            return None  # aligned already, or the reduction dim keeps it ineligible anyway
        b = int(gemm.bias) if gemm.bias is not None and len(node.inputs) > int(gemm.bias) else None
        bias = node.inputs[b] if b is not None else None
        if bias is not None and not self._bias_paddable(bias, gemm.kind is GemmKind.MATMUL, n):
            return None
        return _PadPlan(w, w_axis, b if bias is not None else None, out_axis, dim, n)

    @staticmethod
    def _bias_paddable(bias: ir.Value, broadcast: bool, n: int) -> bool:
        if not is_constant(bias) or bias.shape is None or not bias.shape.is_static():
            return False
        dims = list(bias.shape.numpy())
        if not broadcast:  # a convolution's bias: one per output channel
            return dims == [n]
        # Gemm's C broadcasts to (M, N): its last axis is N or 1 (or it is a scalar).
        return len(dims) <= 2 and (not dims or dims[-1] in (1, n))

    # -- how -------------------------------------------------------------------------------------
    def _apply(self, graph: ir.Graph, node: ir.Node, plan: _PadPlan, names: _Names, opset: int) -> None:
        weight, w_axis, b, out_axis, dim, n = plan
        padded = _round_up(n, self.multiple)
        self._replace_constant(graph, node, weight, w_axis, padded, names)
        bias = node.inputs[b] if b is not None else None
        if b is not None and bias is not None and bias.shape is not None and len(bias.shape) and bias.shape[-1] == n:
            self._replace_constant(graph, node, b, len(bias.shape) - 1, padded, names)

        y = node.outputs[0]
        uses = list(y.uses())
        original_name = y.name
        y.name = names.fresh(f"{original_name}_pad{self.multiple}")
        out = ir.Value(name=original_name, type=y.type, shape=y.shape)
        if y.shape is not None and len(y.shape):
            dims = list(y.shape)
            dims[out_axis] = padded
            y.shape = ir.Shape(dims)
        inputs: list[ir.Value] = [y]
        attrs: list[ir.Attr] = []
        if opset >= 10:
            for suffix, values in (("starts", [0]), ("ends", [n]), ("axes", [out_axis])):
                const_name = names.fresh(f"{original_name}_unpad_{suffix}")
                const = ir.Value(
                    name=const_name,
                    type=ir.TensorType(ir.DataType.INT64),
                    shape=ir.Shape([1]),
                    const_value=ir.tensor(np.array(values, dtype=np.int64), name=const_name),
                )
                graph.register_initializer(const)
                inputs.append(const)
        else:  # Slice-1 takes them as attributes
            attrs = [ir.AttrInt64s("starts", [0]), ir.AttrInt64s("ends", [n]), ir.AttrInt64s("axes", [out_axis])]
        name = names.fresh(f"{node.name or node.op_type}/unpad")
        sl = ir.Node("", "Slice", inputs, attributes=attrs, outputs=[out], name=name)
        graph.insert_after(node, sl)
        for user, index in uses:
            user.replace_input_with(index, out)
        for i, value in enumerate(graph.outputs):
            if value is y:
                graph.outputs[i] = out
        self.paddings.append(Padding(node, dim, n, padded, sl, (y.name, original_name)))

    @staticmethod
    def _replace_constant(graph: ir.Graph, node: ir.Node, index: int, axis: int, size: int, names: _Names) -> None:
        old = node.inputs[index]
        array = constant_array(old) if old is not None else None
        assert old is not None and old.dtype is not None and array is not None, "planned for a constant"
        extra = list(array.shape)
        extra[axis] = size - array.shape[axis]
        new_array = np.concatenate([array, np.zeros(extra, array.dtype)], axis=axis)
        name = names.fresh(f"{old.name}_pad{size}")
        new = ir.Value(
            name=name,
            type=ir.TensorType(old.dtype),
            shape=ir.Shape(list(new_array.shape)),
            const_value=ir.tensor(new_array, dtype=old.dtype, name=name),
        )
        graph.register_initializer(new)
        node.replace_input_with(index, new)
        if old.uses() or old.is_graph_output():
            return
        producer, home = old.producer(), old.graph
        if producer is not None and producer.op_type == "Constant" and producer.graph is not None:
            producer.graph.remove(producer, safe=True)
        elif old.is_initializer() and home is not None and old.name is not None and old.name in home.initializers:
            home.initializers.pop(old.name)

    # -- decisions -------------------------------------------------------------------------------
    def renames(self) -> dict[str, str]:
        """The padded outputs' new names, each with the name its Slice took over (what Casts that
        read the Slice's output call it in their reasons: ``node_decisions``' ``renamed``)."""
        return {new: old for new, old in (p.renamed for p in self.paddings) if new is not None and old is not None}

    def explain(self, decisions: list, nodes: list[ir.Node]) -> None:
        """Describe the padding in the conversion's decisions (``decisions[i]`` is ``nodes[i]``'s)."""
        by_node = {id(p.node): p for p in self.paddings}
        by_slice = {id(p.slice): p for p in self.paddings}
        for decision, node in zip(decisions, nodes, strict=False):
            p = by_node.get(id(node))
            if p is not None:
                decision.reason += (
                    f"; weights padded with zeros for Tensor Cores: {p.dim} {p.before} -> {p.after} "
                    f"({p.slice.name!r} drops the extra outputs)"
                )
            p = by_slice.get(id(node))
            if p is not None:
                dtype = node.outputs[0].dtype
                decision.precision = short_name(dtype) if dtype is not None else "?"
                decision.rule = Rule.PAD_SLICE.value
                decision.reason = (
                    f"Slice inserted: drops the {p.after - p.before} zero outputs that padding "
                    f"{p.node.name or p.node.op_type!r}'s {p.dim} from {p.before} to {p.after} added"
                )
