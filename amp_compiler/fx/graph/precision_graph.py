"""The FX frontend: a :class:`~amp_compiler.core.graph.PrecisionGraph` built from an ATen-level FX graph.

The analysis passes (:mod:`amp_compiler.passes.analysis.pipeline`) are the ONNX path's, unchanged: they read
vertices, their policy entries, their constants and the edges between them. This module gives them
that view of a ``torch.fx.GraphModule`` captured by ``torch.export``:

- a *slot* is a float tensor that a node reads (one per tensor argument, in ``map_arg`` order) or
  produces (one per output; tuple outputs are read through ``getitem`` nodes, which are the tensors);
- the float slots of one ATen node share one vertex (ATen kernels want one dtype: type promotion
  would otherwise upcast), except that
  - schema arguments listed in the entry's ``fp32_args`` (batch_norm's weight, bias and running
    statistics) keep their dtype: constants are read as they are, computed tensors get a fixed slot;
  - outputs not in ``follow_outputs`` (saved statistics) keep their traced dtype;
  - a call with an explicit ``dtype`` argument sets its output's type: an explicit conversion
    (``dtype_attr`` entries: ``_to_copy``, ``to``) has its input and output in two vertices, the
    output free when it converts from a non-float tensor or to the type its input already has
    (lowering rewrites the argument), fixed when it converts between two float types; another op
    whose ``dtype`` is the type its inputs have is one vertex (the argument follows the decision);
    any other explicit type is fixed;
- graph inputs and outputs are fixed vertices (the module keeps its interface);
- parameters and buffers (``get_attr``) are constants: they are listed on the vertices that read them
  (the constant-range rules see their values) and lowering converts or casts them;
- python float scalars passed where the schema takes a Tensor or Scalar (``mul(x, -3.4e38)``,
  ``where(m, x, -inf)``, ``clamp(x, 1e-9)``) are constants too, so the same range rules see them;
- nodes that are not ATen operators (higher-order ops, calls of submodules) keep their dtypes;
- an in-place op that could not be made functional shares the vertex of the tensor it mutates.

Vertices hold :class:`~amp_compiler.fx.graph.views.FxOp` views as their ``node``, and
:class:`~amp_compiler.fx.graph.views.FxSlot` slots (:mod:`amp_compiler.fx.graph.views`).
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Set as AbstractSet

import numpy as np
import onnx_ir as ir
import torch
import torch.fx as fx
from onnx_ir.tensor_adapters import TorchTensor

from amp_compiler.core.graph import PrecisionGraph, SlotKind, UnionFind, Vertex, tensor_edges
from amp_compiler.fx.graph.arguments import (
    has_dtype_argument,
    mutated_arguments,
    scalar_constants,
    schema_argument,
    tensor_arguments,
    viewed,
)
from amp_compiler.fx.graph.integer_flow import counted_ops, index_readers_of
from amp_compiler.fx.graph.policy import AtenPolicy, op_name, policy_name
from amp_compiler.fx.graph.views import FLOAT_DTYPES, TORCH_TO_IR, FxOp, FxSlot, FxValue, is_float, tensor_dtype
from amp_compiler.policy import Category, OpPolicy
from amp_compiler.targets import Target

__all__ = ["FxPrecisionGraph", "build_fx_precision_graph"]


@dataclasses.dataclass
class FxPrecisionGraph:
    """The precision graph and what lowering needs to apply a plan to the FX graph."""

    graph: PrecisionGraph[FxSlot, FxOp]
    slots: list[FxSlot]
    defining: dict[fx.Node, FxSlot]  # tensor -> the slot producing it
    constant_slots: dict[fx.Node, list[FxSlot]]  # parameter/buffer source -> NODE_IN slots reading it
    constant_values: dict[fx.Node, ir.Value]
    dtype_arg_slots: dict[fx.Node, FxSlot]  # nodes whose dtype argument follows this slot's vertex
    observers: list[fx.Node]
    fixed_inputs: dict[tuple[fx.Node, int], fx.Node]  # (node, arg position) -> constant read as it is
    main_vertex: dict[fx.Node, int]  # the vertex that decides a node's reported precision

    def vertex_of(self, slot: FxSlot) -> Vertex[FxSlot, FxOp]:
        return self.graph.vertices[self.graph.slot_vertex[slot]]


def build_fx_precision_graph(
    gm: fx.GraphModule,
    target: Target,
    policy: AtenPolicy,
    *,
    constant_sources: dict[fx.Node, torch.Tensor | None] | None = None,
    unchecked_constants: AbstractSet[fx.Node] = frozenset(),
    table_lookups: bool = True,
) -> FxPrecisionGraph:
    """Build the precision graph of ``gm`` (an ATen-level graph whose nodes carry ``meta["val"]``).

    ``constant_sources``: the nodes that hold parameters and buffers, each with its tensor (None:
    fetch the ``get_attr`` target; default: every float ``get_attr`` node); placeholders can be
    listed too (a torch.compile graph takes its parameters as inputs).
    ``unchecked_constants``: sources whose values change at run time (the loss scale): no range rule.
    ``table_lookups``: whether embedding tables may be stored in low precision (inference only).
    """
    return _Builder(gm, target, policy, constant_sources, unchecked_constants, table_lookups).build()


class _Builder:
    def __init__(self, gm, target, policy, constant_sources, unchecked, table_lookups):
        self.gm = gm
        self.target = target
        self.policy = policy
        if constant_sources is None:
            constant_sources = {n: None for n in gm.graph.nodes if n.op == "get_attr" and is_float(n)}
        self.constants = constant_sources
        self.unchecked = unchecked
        self.table_lookups = table_lookups
        self.uf: UnionFind[FxSlot] = UnionFind()
        self.values: dict[fx.Node, FxValue] = {}
        self.slots: list[FxSlot] = []
        self.fixed: dict[FxSlot, str] = {}
        self.slot_op: dict[FxSlot, FxOp] = {}
        self.slot_policy: dict[FxSlot, OpPolicy | None] = {}
        self.defining: dict[fx.Node, FxSlot] = {}
        self.constant_slots: dict[fx.Node, list[FxSlot]] = {}
        self.constant_values: dict[fx.Node, ir.Value] = {}
        self.scalars: dict[FxSlot, list[ir.Value]] = {}
        self.dtype_arg_slots: dict[fx.Node, FxSlot] = {}
        self.observers: list[fx.Node] = []
        self.fixed_inputs: dict[tuple[fx.Node, int], fx.Node] = {}
        self.main_slot: dict[fx.Node, FxSlot] = {}
        self.unknown: list[FxOp] = []
        self.pending_unions: list[tuple[FxSlot, fx.Node]] = []
        self.ops: dict[fx.Node, FxOp] = {}

    # -- slots -------------------------------------------------------------------------------------
    def _value(self, tensor: fx.Node) -> FxValue:
        value = self.values.get(tensor)
        if value is None:
            value = self.values[tensor] = FxValue(tensor)
        return value

    def _slot(self, kind, owner, index, tensor, op=None, policy=None, arg=None) -> FxSlot:
        dtype = tensor_dtype(tensor)
        if dtype is None:
            raise ValueError(f"{tensor.name} is not a tensor: it has no slot")
        slot = FxSlot(kind, owner, index, tensor, dtype, self._value(tensor), arg)
        self.uf.add(slot)
        self.slots.append(slot)
        if op is not None:
            self.slot_op[slot] = op
        self.slot_policy[slot] = policy
        if slot.defines:
            self.defining[tensor] = slot
        return slot

    def _constant_value(self, node: fx.Node) -> ir.Value:
        value = self.constant_values.get(node)
        if value is None:
            tensor = self._tensor_of(node)
            dtype = TORCH_TO_IR[tensor.dtype]
            value = ir.Value(
                name=str(node.target) if node.op == "get_attr" else node.name,
                type=ir.TensorType(dtype),
                shape=ir.Shape(list(tensor.shape)),
                const_value=TorchTensor(tensor.detach()) if node not in self.unchecked else None,
            )
            self.constant_values[node] = value
        return value

    def _tensor_of(self, node: fx.Node) -> torch.Tensor:
        if self.constants.get(node) is not None:
            return self.constants[node]
        if node.op == "get_attr":
            obj = self.gm
            for part in str(node.target).split("."):
                obj = getattr(obj, part)
            return obj
        return node.meta["val"]  # a parameter placeholder: the example value (see backend)

    # -- nodes -------------------------------------------------------------------------------------
    def _outputs(self, node: fx.Node) -> list[tuple[int, fx.Node]]:
        """(output index, tensor node) of every float output that some node reads."""
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            return [(0, node)] if val.dtype in FLOAT_DTYPES else []
        if isinstance(val, (tuple, list)):
            out = []
            for user in node.users:
                index = user.args[1] if user.op == "call_function" and user.target is operator.getitem else None
                if isinstance(index, int) and is_float(user):
                    out.append((index, user))
            return sorted(out, key=lambda p: (p[0], p[1].name))
        return []

    def _opaque(self, node: fx.Node, why: str) -> None:
        op = FxOp(node, str(node.target), "fx" if node.op != "call_function" else "python", [])
        self.unknown.append(op)
        slots = [
            self._slot(SlotKind.NODE_IN, node, k, t, op, arg=name)
            for k, (name, t) in enumerate(tensor_arguments(node))
            if is_float(t)
        ] + [self._slot(SlotKind.NODE_OUT, node, i, t, op) for i, t in self._outputs(node)]
        for s in slots:
            self.fixed[s] = why
        for s in slots[1:]:
            self.uf.union(slots[0], s)
        if slots:
            self.main_slot[node] = slots[-1]

    def _add_aten(self, node: fx.Node, name: str) -> None:
        pname = policy_name(name)
        entry = self.policy.get(pname)
        info = self.policy.info_of(pname)
        if info.observer:
            self.observers.append(node)
            return
        args = tensor_arguments(node)
        inputs = [self._constant_value(t) if t in self.constants else None for _, t in args]
        if not (self.table_lookups and pname == "embedding"):
            inputs = [None] * len(inputs)  # painting's table rule reads inputs[0]: not a table here
        op = self.ops[node] = FxOp(node, name, "aten", inputs)
        if entry is None:
            self.unknown.append(op)

        in_slots: list[FxSlot] = []
        for k, (arg, t) in enumerate(args):
            if not is_float(t):
                continue
            if arg in info.fp32_args:
                if t in self.constants:
                    self.fixed_inputs[(node, k)] = t  # read as it is: no slot
                    continue
                slot = self._slot(SlotKind.NODE_IN, node, k, t, op, entry, arg)
                self.fixed[slot] = f"{name}'s argument {arg!r} keeps its dtype (mixed-type kernel)"
                continue
            in_slots.append(self._slot(SlotKind.NODE_IN, node, k, t, op, entry, arg))
        out_slots: list[FxSlot] = []
        for i, t in self._outputs(node):
            slot = self._slot(SlotKind.NODE_OUT, node, i, t, op, entry)
            if info.follow_outputs is not None and i not in info.follow_outputs:
                self.fixed[slot] = f"output {i} of {name} keeps its traced dtype (saved statistics)"
                continue
            out_slots.append(slot)

        present, dtype = schema_argument(node, "dtype") if has_dtype_argument(node) else (False, None)
        explicit = isinstance(dtype, torch.dtype)
        in_dtypes = {s.dtype for s in in_slots}
        conversion = entry is not None and entry.dtype_attr is not None
        if not explicit:
            group = in_slots + out_slots
            if out_slots and not in_slots:
                for s in out_slots:
                    self.fixed[s] = f"{name} sets its output's type itself"
            self._union(group)
        else:
            identity = bool(in_slots) and in_dtypes == {dtype}
            if identity and not conversion:
                self._union(in_slots + out_slots)
                if out_slots:
                    self.dtype_arg_slots[node] = out_slots[0]
            else:
                self._union(in_slots)
                self._union(out_slots)
                if out_slots:
                    if conversion and (identity or not in_slots):
                        self.dtype_arg_slots[node] = out_slots[0]
                    elif in_slots:
                        src = "/".join(sorted(str(d).removeprefix("torch.") for d in in_dtypes))
                        for s in out_slots:
                            self.fixed[s] = (
                                f"an explicit conversion from {src} to "
                                f"{str(dtype).removeprefix('torch.')} that the model makes"
                            )
                    else:
                        for s in out_slots:
                            self.fixed[s] = f"{name} sets its output's type itself"

        main = out_slots[0] if out_slots else (in_slots[0] if in_slots else None)
        if main is None:
            return
        self.main_slot[node] = main
        scalars = [
            ir.Value(
                name=f"{node.name}.{arg}",
                type=ir.TensorType(ir.DataType.FLOAT),
                shape=ir.Shape([]),
                const_value=ir.tensor(np.array(v, dtype=np.float32)),
            )
            for arg, v in scalar_constants(node)
        ]
        if scalars:
            self.scalars.setdefault(main, []).extend(scalars)

        mutated = mutated_arguments(node)
        for arg, t in args:
            if arg not in mutated or not is_float(t):
                continue
            if t.op in ("placeholder", "get_attr") or t in self.constants:
                for s in in_slots + out_slots:
                    self.fixed[s] = f"{name} writes into a graph input, parameter or buffer in place"
            else:
                self.pending_unions.append((main, t))

    def _union(self, slots: list[FxSlot]) -> None:
        for s in slots[1:]:
            self.uf.union(slots[0], s)

    # -- assemble ----------------------------------------------------------------------------------
    def build(self) -> FxPrecisionGraph:
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                if node in self.constants or not is_float(node):
                    continue
                slot = self._slot(SlotKind.GRAPH_IN, node, 0, node)
                self.fixed[slot] = "graph inputs keep their dtype"
            elif node.op == "get_attr":
                continue
            elif node.op == "output":
                for k, (_, t) in enumerate(tensor_arguments(node)):
                    if is_float(t):
                        slot = self._slot(SlotKind.GRAPH_OUT, node, k, t)
                        self.fixed[slot] = "graph outputs keep their dtype"
            elif node.op == "call_function" and node.target is operator.getitem:
                continue  # the producer's output slot
            elif node.op == "call_function" and (name := op_name(node.target)) is not None:
                self._add_aten(node, name)
            elif node.op == "call_module" and node.target == "_guards_fn":
                self.observers.append(node)  # torch.export's input guards: reads shapes only
            else:
                self._opaque(node, f"{node.op} {node.target} is not an ATen operator: it keeps its dtypes")

        # Constant inputs: listed on the vertex that reads them, never an edge.
        for slot in self.slots:
            if slot.kind is SlotKind.NODE_IN and slot.tensor in self.constants:
                self.constant_slots.setdefault(slot.tensor, []).append(slot)
        # An in-place op that stayed in place writes into its tensor and, through views, into their
        # bases: all of them share its vertex, so no cast copy stands between the write and a reader.
        for main, written in self.pending_unions:
            seen = set()
            tensor: fx.Node | None = written
            while isinstance(tensor, fx.Node) and tensor not in seen:
                seen.add(tensor)
                src = self.defining.get(tensor)
                if src is not None:
                    self.uf.union(main, src)
                tensor = viewed(tensor)

        members = self.uf.groups()
        vertices: list[Vertex] = []
        slot_vertex: dict[FxSlot, int] = {}
        node_vertices: dict[FxOp, list[int]] = {}
        for group in members.values():
            vertex = self._make_vertex(len(vertices), group)
            vertices.append(vertex)
            for s in group:
                slot_vertex[s] = vertex.id
                op = self.slot_op.get(s)
                if op is not None:
                    lst = node_vertices.setdefault(op, [])
                    if vertex.id not in lst:
                        lst.append(vertex.id)

        # Edges carry the tensors as the passes read them (FxValue); constants make no edge.
        uses = (
            (slot_vertex[src], slot_vertex[slot], slot.value)
            for slot in self.slots
            if not slot.defines and slot.tensor not in self.constants
            and (src := self.defining.get(slot.tensor)) is not None
        )
        digraph = tensor_edges(len(vertices), uses)

        graph = PrecisionGraph(
            model=self.gm,
            target=self.target,
            vertices=vertices,
            slot_vertex=slot_vertex,
            digraph=digraph,
            node_vertices=node_vertices,
            unknown_ops=self.unknown,
            index_readers=index_readers_of(self.policy, self.ops),
            counted=counted_ops(self.gm, self.policy, self.ops, self.constants.keys()),
        )
        return FxPrecisionGraph(
            graph=graph,
            slots=self.slots,
            defining=self.defining,
            constant_slots=self.constant_slots,
            constant_values=self.constant_values,
            dtype_arg_slots=self.dtype_arg_slots,
            observers=self.observers,
            fixed_inputs=self.fixed_inputs,
            main_vertex={n: slot_vertex[s] for n, s in self.main_slot.items()},
        )

    def _make_vertex(self, vid: int, slots: list[FxSlot]) -> Vertex:
        slots.sort(key=lambda s: (s.kind is not SlotKind.NODE_OUT, s.kind.value, s.index))
        op = next((self.slot_op[s] for s in slots if s in self.slot_op), None)
        policy = next((self.slot_policy[s] for s in slots if self.slot_policy.get(s) is not None), None)
        dtypes = {s.dtype for s in slots}
        dtype = TORCH_TO_IR[next(iter(dtypes))] if len(dtypes) == 1 else None
        constants: list[ir.Value] = []
        for s in slots:
            if s.kind is SlotKind.NODE_IN and s.tensor in self.constants:
                value = self._constant_value(s.tensor)
                if value not in constants and s.tensor not in self.unchecked:
                    constants.append(value)
            constants.extend(self.scalars.get(s, ()))
        vertex = Vertex(vid, slots, op, dtype, policy, constants=constants)
        vertex.fixed_reason = self._fixed_reason(vertex, slots, dtypes)
        return vertex

    def _fixed_reason(self, vertex: Vertex, slots: list[FxSlot], dtypes: set) -> str | None:
        for s in slots:
            if s in self.fixed:
                return self.fixed[s]
        if len(dtypes) > 1:
            return "its tensors disagree on the element type"
        if vertex.dtype is not ir.DataType.FLOAT:
            return f"it is already {str(next(iter(dtypes))).removeprefix('torch.')}"
        op = vertex.node
        if op is not None and vertex.policy is not None and vertex.policy.category is Category.NONFLOAT:
            return f"{op.op_type} is never touched: {vertex.policy.reason}"
        return None
