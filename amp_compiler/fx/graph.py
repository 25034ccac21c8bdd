"""The FX frontend: a :class:`~amp_compiler.graph.PrecisionGraph` built from an ATen-level FX graph.

The analysis passes (classify, constant ranges, paint) are the ONNX path's, unchanged: they read
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

Vertices hold :class:`FxOp` adapters as their ``node``: ``op_type`` is the ATen packet name
(``"linear"``), ``domain`` is ``"aten"``, ``name`` the FX node name.
"""

from __future__ import annotations

import dataclasses
import operator

import networkx as nx
import numpy as np
import onnx_ir as ir
import torch
import torch.fx as fx
from onnx_ir.tensor_adapters import TorchTensor

from amp_compiler.fx.policy import AtenPolicy, op_name, policy_name
from amp_compiler.graph import PrecisionGraph, SlotKind, Vertex
from amp_compiler.policy import Category
from amp_compiler.targets import Target

TORCH_TO_IR = {
    torch.float32: ir.DataType.FLOAT,
    torch.float16: ir.DataType.FLOAT16,
    torch.bfloat16: ir.DataType.BFLOAT16,
    torch.float64: ir.DataType.DOUBLE,
}
IR_TO_TORCH = {v: k for k, v in TORCH_TO_IR.items()}
FLOAT_DTYPES = frozenset(TORCH_TO_IR)
_SCALAR_TYPES = ("Tensor", "Optional[Tensor]", "number", "Optional[number]")  # Tensor and Scalar arguments


def tensor_dtype(node) -> torch.dtype | None:
    """The dtype of the tensor an FX node produces (from its traced ``val``), None if not a tensor."""
    if not isinstance(node, fx.Node):
        return None
    val = node.meta.get("val")
    return val.dtype if isinstance(val, torch.Tensor) else None


def is_float(node) -> bool:
    return tensor_dtype(node) in FLOAT_DTYPES


class FxOp:
    """What the analysis passes read of a node (``op_type``, ``domain``, ``name``, ``inputs``)."""

    __slots__ = ("fx", "op_type", "domain", "name", "inputs")

    def __init__(self, node: fx.Node, op_type: str, domain: str, inputs: list):
        self.fx = node
        self.op_type = op_type
        self.domain = domain
        self.name = node.name
        self.inputs = inputs

    def __repr__(self) -> str:
        return f"FxOp({self.op_type}, {self.name})"


class FxValue:
    """A tensor of the FX graph as the passes read values (``onnx_ir.Value``'s names): its name, its
    shape (symbolic sizes count as their hint, or 1), and whether it is a graph input or a constant."""

    __slots__ = ("name", "shape", "_input", "_constant")

    def __init__(self, node: fx.Node, *, graph_input: bool, constant: bool):
        self.name = node.name
        val = node.meta.get("val")
        dims = []
        for d in getattr(val, "shape", ()):
            try:
                dims.append(int(d))
            except (TypeError, ValueError, RuntimeError):
                hint = getattr(getattr(d, "node", None), "hint", None)
                dims.append(int(hint) if isinstance(hint, int) else 1)
        self.shape = ir.Shape(dims) if val is not None else None
        self._input = graph_input
        self._constant = constant

    def is_graph_input(self) -> bool:
        return self._input

    def is_initializer(self) -> bool:
        return self._constant

    @property
    def const_value(self):
        return True if self._constant else None

    def producer(self):
        return None

    def __repr__(self) -> str:
        return f"FxValue({self.name})"


@dataclasses.dataclass(frozen=True, eq=False)
class FxSlot:
    """A float tensor a node reads (NODE_IN, GRAPH_OUT) or produces (NODE_OUT, GRAPH_IN)."""

    kind: SlotKind
    owner: fx.Node  # the node reading or producing the tensor (the output node for GRAPH_OUT)
    index: int  # NODE_IN/GRAPH_OUT: position among the owner's tensor arguments; NODE_OUT: output index
    tensor: fx.Node  # the node whose value the tensor is (a getitem node for tuple outputs)
    dtype: torch.dtype  # the traced dtype
    arg: str | None = None  # the schema argument name (NODE_IN)
    value: FxValue | None = None  # one adapter per tensor, shared by all its slots

    @property
    def defines(self) -> bool:
        return self.kind in (SlotKind.NODE_OUT, SlotKind.GRAPH_IN)


@dataclasses.dataclass
class FxPrecisionGraph:
    """The precision graph and what lowering needs to apply a plan to the FX graph."""

    graph: PrecisionGraph
    slots: list[FxSlot]
    defining: dict[fx.Node, FxSlot]  # tensor -> the slot producing it
    constant_slots: dict[fx.Node, list[FxSlot]]  # parameter/buffer source -> NODE_IN slots reading it
    constant_values: dict[fx.Node, ir.Value]
    dtype_arg_slots: dict[fx.Node, FxSlot]  # nodes whose dtype argument follows this slot's vertex
    observers: list[fx.Node]
    fixed_inputs: dict[tuple[fx.Node, int], fx.Node]  # (node, arg position) -> constant read as it is
    main_vertex: dict[fx.Node, int]  # the vertex that decides a node's reported precision

    def vertex_of(self, slot: FxSlot) -> Vertex:
        return self.graph.vertices[self.graph.slot_vertex[slot]]


def tensor_arguments(node: fx.Node) -> list[tuple[str | None, fx.Node]]:
    """(schema argument name, node) for every node among ``node``'s args then kwargs, in map_arg order."""
    names = _positional_names(node)
    out: list[tuple[str | None, fx.Node]] = []
    for i, a in enumerate(node.args):
        name = names[i] if i < len(names) else None
        fx.node.map_arg(a, lambda n, name=name: out.append((name, n)) or n)
    for key, a in node.kwargs.items():
        fx.node.map_arg(a, lambda n, key=key: out.append((key, n)) or n)
    return out


def replace_tensor_arguments(node: fx.Node, replacements: dict[int, fx.Node]) -> None:
    """Replace the tensor arguments at the given positions (as numbered by :func:`tensor_arguments`)."""
    if not replacements:
        return
    counter = iter(range(1 << 30))

    def swap(n: fx.Node) -> fx.Node:
        return replacements.get(next(counter), n)

    args = tuple(fx.node.map_arg(a, swap) for a in node.args)
    kwargs = {k: fx.node.map_arg(a, swap) for k, a in node.kwargs.items()}
    node.args = args
    node.kwargs = kwargs


def _positional_names(node: fx.Node) -> list[str]:
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return [a.name for a in target._schema.arguments if not a.kwarg_only]
    return []


def schema_argument(node: fx.Node, name: str):
    """(present, value) of the schema argument ``name`` in the call (keyword or positional)."""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return False, None
    if name in node.kwargs:
        return True, node.kwargs[name]
    for i, a in enumerate(target._schema.arguments):
        if a.name == name:
            if not a.kwarg_only and i < len(node.args):
                return True, node.args[i]
            return False, a.default_value if a.has_default_value() else None
    return False, None


def set_schema_argument(node: fx.Node, name: str, value) -> None:
    """Set the schema argument ``name`` (where the call passes it, else as a keyword)."""
    target = node.target
    for i, a in enumerate(target._schema.arguments):
        if a.name == name and not a.kwarg_only and i < len(node.args) and name not in node.kwargs:
            args = list(node.args)
            args[i] = value
            node.args = tuple(args)
            return
    kwargs = dict(node.kwargs)
    kwargs[name] = value
    node.kwargs = kwargs


def has_dtype_argument(node: fx.Node) -> bool:
    target = node.target
    return isinstance(target, torch._ops.OpOverload) and any(
        a.name == "dtype" for a in target._schema.arguments
    )


def _scalar_constants(node: fx.Node) -> list[tuple[str, float]]:
    """Python floats the call passes where the schema takes a Tensor or Scalar."""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return []
    out = []
    args = target._schema.arguments
    for i, a in enumerate(args):
        if a.kwarg_only or i >= len(node.args):
            value = node.kwargs.get(a.name)
        else:
            value = node.args[i]
        if isinstance(value, float) and str(a.type) in _SCALAR_TYPES:
            out.append((a.name, value))
    return out


def _mutated_arguments(node: fx.Node) -> set[str]:
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return set()
    return {
        a.name for a in target._schema.arguments if a.alias_info is not None and a.alias_info.is_write
    }


def _viewed(node: fx.Node) -> fx.Node | None:
    """The tensor ``node`` is a view of (its first tensor argument), or None if it is not a view."""
    if node.op != "call_function":
        return None
    if node.target is operator.getitem:
        node = node.args[0]
        if not isinstance(node, fx.Node) or node.op != "call_function":
            return None
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return None
    if not any(r.alias_info is not None for r in target._schema.returns):
        return None
    args = tensor_arguments(node)
    return args[0][1] if args else None


class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[FxSlot, FxSlot] = {}

    def add(self, s: FxSlot) -> None:
        self.parent.setdefault(s, s)

    def find(self, s: FxSlot) -> FxSlot:
        root = s
        while self.parent[root] is not root:
            root = self.parent[root]
        while self.parent[s] is not root:
            self.parent[s], s = root, self.parent[s]
        return root

    def union(self, a: FxSlot, b: FxSlot) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra is not rb:
            self.parent[rb] = ra


def build_fx_precision_graph(
    gm: fx.GraphModule,
    target: Target,
    policy: AtenPolicy,
    *,
    constant_sources: dict[fx.Node, torch.Tensor | None] | None = None,
    unchecked_constants: set[fx.Node] = frozenset(),
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
        self.uf = _UnionFind()
        self.values: dict[fx.Node, FxValue] = {}
        self.slots: list[FxSlot] = []
        self.fixed: dict[FxSlot, str] = {}
        self.slot_op: dict[FxSlot, FxOp] = {}
        self.slot_policy: dict[FxSlot, object] = {}
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

    # -- slots -------------------------------------------------------------------------------------
    def _value(self, tensor: fx.Node) -> FxValue:
        value = self.values.get(tensor)
        if value is None:
            value = FxValue(
                tensor,
                graph_input=tensor.op == "placeholder" and tensor not in self.constants,
                constant=tensor in self.constants,
            )
            self.values[tensor] = value
        return value

    def _slot(self, kind, owner, index, tensor, op=None, policy=None, arg=None) -> FxSlot:
        slot = FxSlot(kind, owner, index, tensor, tensor_dtype(tensor), arg, self._value(tensor))
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
                if user.op == "call_function" and user.target is operator.getitem and is_float(user):
                    out.append((int(user.args[1]), user))
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
        op = FxOp(node, name, "aten", inputs)
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
            for arg, v in _scalar_constants(node)
        ]
        if scalars:
            self.scalars.setdefault(main, []).extend(scalars)

        mutated = _mutated_arguments(node)
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
        for main, tensor in self.pending_unions:
            seen = set()
            while isinstance(tensor, fx.Node) and tensor not in seen:
                seen.add(tensor)
                src = self.defining.get(tensor)
                if src is not None:
                    self.uf.union(main, src)
                tensor = _viewed(tensor)

        members: dict[FxSlot, list[FxSlot]] = {}
        for slot in self.slots:
            members.setdefault(self.uf.find(slot), []).append(slot)
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

        digraph = nx.DiGraph()
        digraph.add_nodes_from(range(len(vertices)))
        for slot in self.slots:
            if slot.defines or slot.tensor in self.constants:
                continue
            src = self.defining.get(slot.tensor)
            vid = slot_vertex[slot]
            if src is None or slot_vertex[src] == vid:
                continue
            s = slot_vertex[src]
            if digraph.has_edge(s, vid):  # edges carry the tensors as the passes read them (FxValue)
                digraph[s][vid]["values"].append(slot.value)
            else:
                digraph.add_edge(s, vid, values=[slot.value])

        graph = PrecisionGraph(
            model=self.gm,
            target=self.target,
            vertices=vertices,
            slot_vertex=slot_vertex,
            digraph=digraph,
            node_vertices=node_vertices,
            unknown_ops=self.unknown,
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
        if vertex.policy is not None and vertex.policy.category is Category.NONFLOAT:
            return f"{vertex.node.op_type} is never touched: {vertex.policy.reason}"
        return None
