"""The precision graph: the ONNX frontend's framework-neutral view of a model for analysis.

A *slot* is one place where a float tensor's dtype is fixed: a node input or output, a graph input or
output. Slots that must share a dtype form one *vertex*:

- inputs and outputs of a node that share a schema type parameter (``T`` of MatMul);
- input-only type parameters of a node (BatchNormalization's ``T1``/``T2`` statistics) follow the
  node's main group, so kernels templated on one type find a match;
- the values that If/Loop/Scan pass across their bodies (branch outputs, loop-carried values, scan
  inputs and outputs).

Edges go from the vertex that defines a tensor to every vertex that uses it. A precision is chosen per
vertex; where an edge joins two different precisions, lowering inserts one Cast for that tensor and
dtype. Constants (initializers and Constant nodes) are not vertices: lowering converts them offline
for each precision their users need.

Building the graph reads the model and never edits it.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterator

import networkx as nx
import onnx_ir as ir

from amp_compiler import schemas
from amp_compiler.policy import Category, OpPolicy, PolicyTable
from amp_compiler.targets import Target

FLOAT_TYPES = frozenset(
    {ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE}
)
_TYPE_STR = {
    ir.DataType.FLOAT: "tensor(float)",
    ir.DataType.FLOAT16: "tensor(float16)",
    ir.DataType.BFLOAT16: "tensor(bfloat16)",
    ir.DataType.DOUBLE: "tensor(double)",
}
_FLOAT_TYPE_STRS = frozenset(_TYPE_STR.values())
CONTROL_FLOW_OPS = frozenset({"If", "Loop", "Scan"})


class SlotKind(enum.Enum):
    NODE_IN = "node input"
    NODE_OUT = "node output"
    GRAPH_IN = "graph input"
    GRAPH_OUT = "graph output"


@dataclasses.dataclass(frozen=True, eq=False)
class Slot:
    kind: SlotKind
    owner: ir.Node | ir.Graph
    index: int

    def __hash__(self) -> int:
        return hash((self.kind, id(self.owner), self.index))

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Slot)
            and self.kind is other.kind
            and self.owner is other.owner
            and self.index == other.index
        )

    @property
    def value(self) -> ir.Value | None:
        if self.kind is SlotKind.NODE_IN:
            return self.owner.inputs[self.index]
        if self.kind is SlotKind.NODE_OUT:
            return self.owner.outputs[self.index]
        if self.kind is SlotKind.GRAPH_IN:
            return self.owner.inputs[self.index]
        return self.owner.outputs[self.index]

    @property
    def defines(self) -> bool:
        """True for slots that produce their tensor (node outputs, graph inputs)."""
        return self.kind in (SlotKind.NODE_OUT, SlotKind.GRAPH_IN)


@dataclasses.dataclass
class Vertex:
    """Slots that share one dtype, and what the analysis needs to know about them."""

    id: int
    slots: list[Slot]
    node: ir.Node | None  # the node whose op decides the category; None for graph inputs/outputs
    dtype: ir.DataType | None  # current element type (None: unknown)
    policy: OpPolicy | None
    fixed_reason: str | None = None  # why the dtype cannot change; None when it is a free choice
    constants: list[ir.Value] = dataclasses.field(default_factory=list)  # constants it reads

    @property
    def free(self) -> bool:
        return self.fixed_reason is None

    @property
    def category(self) -> Category:
        if self.node is None or self.node.op_type in CONTROL_FLOW_OPS:
            return Category.PASS
        return self.policy.category if self.policy is not None else Category.HIGH

    def describe(self) -> str:
        if self.node is not None:
            return f"{self.node.op_type} node {self.node.name!r}"
        slot = self.slots[0]
        return f"{slot.kind.value} {slot.value.name!r}" if slot.value is not None else "graph I/O"


def iter_graphs(graph: ir.Graph) -> Iterator[ir.Graph]:
    """The graph and all its subgraphs, depth first, parents before children."""
    yield graph
    for node in graph:
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.GRAPH:
                yield from iter_graphs(attr.value)
            elif attr.type == ir.AttributeType.GRAPHS:
                for sub in attr.value:
                    yield from iter_graphs(sub)


def is_constant(value: ir.Value) -> bool:
    """Initializers (that are not graph inputs) and outputs of Constant nodes."""
    if value.is_graph_input():
        return False
    if value.const_value is not None and value.is_initializer():
        return True
    producer = value.producer()
    return producer is not None and producer.op_type == "Constant" and producer.domain in ("", "ai.onnx")


def _tensor_dtype(value: ir.Value | None) -> tuple[bool, ir.DataType | None]:
    """(is a tensor or unknown, dtype) for a value; sequences and optionals are not tensors."""
    if value is None:
        return False, None
    if value.type is None:
        return True, None
    if isinstance(value.type, ir.TensorType):
        return True, value.type.dtype
    return False, None


class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[Slot, Slot] = {}

    def add(self, s: Slot) -> None:
        self.parent.setdefault(s, s)

    def find(self, s: Slot) -> Slot:
        root = s
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[s] != root:
            self.parent[s], s = root, self.parent[s]
        return root

    def union(self, a: Slot, b: Slot) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[rb] = ra


@dataclasses.dataclass
class PrecisionGraph:
    model: ir.Model
    target: Target
    vertices: list[Vertex]
    slot_vertex: dict[Slot, int]
    digraph: nx.DiGraph  # vertex id -> vertex id, edge attribute "values": tensors on the edge
    node_vertices: dict[ir.Node, list[int]]
    unknown_ops: list[ir.Node]

    def vertex_of(self, slot: Slot) -> Vertex | None:
        vid = self.slot_vertex.get(slot)
        return None if vid is None else self.vertices[vid]


def build_precision_graph(
    model: ir.Model, target: Target, policy: PolicyTable, keep_io_types: bool = True
) -> PrecisionGraph:
    """Build the precision graph of ``model`` (which must carry inferred types)."""
    return _Builder(model, target, policy, keep_io_types).build()


class _Builder:
    def __init__(self, model: ir.Model, target: Target, policy: PolicyTable, keep_io: bool):
        self.model = model
        self.target = target
        self.policy = policy
        self.keep_io = keep_io
        self.uf = _UnionFind()
        # Per slot: the types its schema allows (None: no schema, the slot is fixed).
        self.allowed: dict[Slot, frozenset[str] | None] = {}
        self.slot_node: dict[Slot, ir.Node | None] = {}
        self.fixed: dict[Slot, str] = {}  # slots fixed for a reason of their own
        self.tied: set[Slot] = set()  # body I/O slots tied to a control-flow node
        self.unknown_ops: list[ir.Node] = []

    # -- slots ---------------------------------------------------------------------------------
    def _slot(self, kind: SlotKind, owner, index: int, allowed, node) -> Slot | None:
        value = owner.inputs[index] if kind in (SlotKind.NODE_IN, SlotKind.GRAPH_IN) else owner.outputs[index]
        is_tensor, dtype = _tensor_dtype(value)
        if not is_tensor:
            return None
        if dtype is not None and dtype not in FLOAT_TYPES:
            return None
        if dtype is None and allowed is not None and not (allowed & _FLOAT_TYPE_STRS):
            return None  # untyped, but the schema says it cannot be float
        slot = Slot(kind, owner, index)
        self.uf.add(slot)
        self.allowed[slot] = allowed
        self.slot_node[slot] = node
        if dtype is None:
            self.fixed[slot] = "its element type is unknown (shape inference gave none)"
        return slot

    def _opset(self, domain: str) -> int:
        imports = self.model.opset_imports
        dom = "" if domain == "ai.onnx" else domain
        return imports.get(dom, imports.get("ai.onnx", 1) if dom == "" else 1)

    # -- nodes ---------------------------------------------------------------------------------
    def _add_node(self, node: ir.Node) -> None:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            return  # a constant source, converted offline by lowering
        sig = schemas.lookup(node.domain, node.op_type, self._opset(node.domain))
        if sig is None:
            self.unknown_ops.append(node)
        groups: dict[object, list[Slot]] = {}
        group_has_output: dict[object, bool] = {}
        for is_input, values in ((True, node.inputs), (False, node.outputs)):
            kind = SlotKind.NODE_IN if is_input else SlotKind.NODE_OUT
            for i, v in enumerate(values):
                if v is None:
                    continue
                allowed = sig.allowed_types(is_input, i) if sig is not None else None
                slot = self._slot(kind, node, i, allowed, node)
                if slot is None:
                    continue
                if sig is None:
                    self.fixed[slot] = f"no schema is known for {node.domain or 'ai.onnx'}::{node.op_type}"
                    continue
                key = sig.type_key(is_input, i)
                if key is None:
                    self.fixed[slot] = "the schema has no formal parameter at this position"
                    continue
                if not isinstance(key, tuple) and key not in sig.allowed:
                    continue  # a fixed-type formal ("tensor(float)"): its own, fixed, group
                groups.setdefault(key, []).append(slot)
                group_has_output[key] = group_has_output.get(key, False) or not is_input
        for slots in groups.values():
            for s in slots[1:]:
                self.uf.union(slots[0], s)
        # Input-only type parameters follow the node's main group (the first one with an output).
        # Not for conversion ops (Cast, CastLike: ``dtype_attr``), whose input and output types differ.
        main = next((k for k, has_out in group_has_output.items() if has_out), None)
        policy = self.policy.get(node.domain, node.op_type)
        converts = policy is not None and policy.dtype_attr is not None
        # Output-only groups whose type parameter belongs to an input that is absent (LinearAttention's
        # present_state without past_state) take the main group's type in onnx's type inference.
        if main is not None and not isinstance(main, tuple) and not converts:
            for key, slots in groups.items():
                if key == main or isinstance(key, tuple):
                    continue
                has_input = any(s.kind is SlotKind.NODE_IN for s in slots)
                input_absent = not has_input and any(f.type_str == key for f in sig.inputs)
                if (has_input and not group_has_output[key]) or input_absent:
                    if self.target.type_str in (self.allowed[slots[0]] or ()):
                        self.uf.union(groups[main][0], slots[0])
        if node.op_type in CONTROL_FLOW_OPS and node.domain in ("", "ai.onnx"):
            self._tie_control_flow(node)

    def _body(self, node: ir.Node, name: str) -> ir.Graph | None:
        attr = node.attributes.get(name)
        return attr.value if attr is not None and attr.type == ir.AttributeType.GRAPH else None

    def _tie(self, *slots: Slot | None) -> None:
        present = [s for s in slots if s is not None]
        for s in present:
            if s.kind in (SlotKind.GRAPH_IN, SlotKind.GRAPH_OUT):
                self.tied.add(s)
        for s in present[1:]:
            self.uf.union(present[0], s)

    def _io(self, graph: ir.Graph, is_input: bool, index: int) -> Slot | None:
        kind = SlotKind.GRAPH_IN if is_input else SlotKind.GRAPH_OUT
        n = len(graph.inputs if is_input else graph.outputs)
        if index >= n:
            return None
        slot = Slot(kind, graph, index)
        return slot if slot in self.uf.parent else None

    def _out(self, node: ir.Node, i: int) -> Slot | None:
        s = Slot(SlotKind.NODE_OUT, node, i)
        return s if s in self.uf.parent else None

    def _in(self, node: ir.Node, i: int) -> Slot | None:
        s = Slot(SlotKind.NODE_IN, node, i)
        return s if s in self.uf.parent else None

    def _tie_control_flow(self, node: ir.Node) -> None:
        op = node.op_type
        if op == "If":
            then_g, else_g = self._body(node, "then_branch"), self._body(node, "else_branch")
            if then_g is None or else_g is None:
                return
            for k in range(len(node.outputs)):
                self._tie(self._out(node, k), self._io(then_g, False, k), self._io(else_g, False, k))
        elif op == "Loop":
            body = self._body(node, "body")
            if body is None:
                return
            n_carried = max(len(node.inputs) - 2, 0)
            for k in range(n_carried):
                self._tie(
                    self._in(node, 2 + k),
                    self._io(body, True, 2 + k),
                    self._io(body, False, 1 + k),
                    self._out(node, k),
                )
            for j in range(n_carried, len(node.outputs)):
                self._tie(self._io(body, False, 1 + j), self._out(node, j))
        elif op == "Scan":
            body = self._body(node, "body")
            n_scan = node.attributes.get("num_scan_inputs")
            if body is None or n_scan is None or self._opset("") < 9:
                return
            n_state = len(node.inputs) - n_scan.as_int()
            for k in range(len(node.inputs)):
                self._tie(self._in(node, k), self._io(body, True, k))
            for k in range(len(node.outputs)):
                self._tie(self._io(body, False, k), self._out(node, k))
                if k < n_state:
                    self._tie(self._io(body, True, k), self._io(body, False, k))

    # -- graph I/O -----------------------------------------------------------------------------
    def _add_graph_io(self, graph: ir.Graph, is_main: bool) -> None:
        for is_input, values in ((True, graph.inputs), (False, graph.outputs)):
            kind = SlotKind.GRAPH_IN if is_input else SlotKind.GRAPH_OUT
            for i in range(len(values)):
                slot = self._slot(kind, graph, i, None, None)
                if slot is None:
                    continue
                if is_main and self.keep_io:
                    self.fixed[slot] = "graph inputs and outputs keep their dtype (keep_io_types)"
                elif is_main and not is_input and (
                    is_constant(values[i]) or values[i].is_graph_input()
                ):
                    self.fixed[slot] = "a graph output that is a constant or a graph input keeps its dtype"

    # -- assemble ------------------------------------------------------------------------------
    def build(self) -> PrecisionGraph:
        main = self.model.graph
        graphs = list(iter_graphs(main))
        for g in graphs:
            self._add_graph_io(g, g is main)
        for g in graphs:
            for node in g:
                self._add_node(node)
        for g in graphs:
            if g is main:
                continue
            for slot in [Slot(SlotKind.GRAPH_IN, g, i) for i in range(len(g.inputs))] + [
                Slot(SlotKind.GRAPH_OUT, g, i) for i in range(len(g.outputs))
            ]:
                if slot in self.uf.parent and slot not in self.tied:
                    self.fixed[slot] = "a subgraph input/output whose owner op is not If/Loop/Scan"

        members: dict[Slot, list[Slot]] = {}
        for slot in self.uf.parent:
            members.setdefault(self.uf.find(slot), []).append(slot)

        vertices: list[Vertex] = []
        slot_vertex: dict[Slot, int] = {}
        node_vertices: dict[ir.Node, list[int]] = {}
        for slots in members.values():
            vertex = self._make_vertex(len(vertices), slots)
            vertices.append(vertex)
            for s in slots:
                slot_vertex[s] = vertex.id
                if s.kind in (SlotKind.NODE_IN, SlotKind.NODE_OUT):
                    lst = node_vertices.setdefault(s.owner, [])
                    if vertex.id not in lst:
                        lst.append(vertex.id)

        digraph = nx.DiGraph()
        digraph.add_nodes_from(range(len(vertices)))
        defining: dict[ir.Value, int] = {}
        for slot, vid in slot_vertex.items():
            if slot.defines:
                defining[slot.value] = vid
        for slot, vid in slot_vertex.items():
            if slot.defines:
                continue
            value = slot.value
            if is_constant(value):
                vertices[vid].constants.append(value)
                continue
            src = defining.get(value)
            if src is None or src == vid:
                continue
            if digraph.has_edge(src, vid):
                digraph[src][vid]["values"].append(value)
            else:
                digraph.add_edge(src, vid, values=[value])
        return PrecisionGraph(
            self.model, self.target, vertices, slot_vertex, digraph, node_vertices, self.unknown_ops
        )

    def _make_vertex(self, vid: int, slots: list[Slot]) -> Vertex:
        slots.sort(key=lambda s: (s.kind is not SlotKind.NODE_OUT, s.kind.value, s.index))
        node = None
        for s in slots:
            owner_node = self.slot_node.get(s)
            if owner_node is not None and (node is None or owner_node.op_type in CONTROL_FLOW_OPS):
                node = owner_node
        policy = self.policy.get(node.domain, node.op_type) if node is not None else None
        dtypes = {d for s in slots if (d := _tensor_dtype(s.value)[1]) is not None}
        vertex = Vertex(vid, slots, node, next(iter(dtypes)) if len(dtypes) == 1 else None, policy)
        vertex.fixed_reason = self._fixed_reason(vertex, slots, dtypes)
        return vertex

    def _fixed_reason(self, vertex: Vertex, slots: list[Slot], dtypes: set) -> str | None:
        for s in slots:
            if s in self.fixed:
                return self.fixed[s]
        if len(dtypes) > 1:
            return "its slots disagree on the element type"
        if vertex.dtype is not ir.DataType.FLOAT:
            return f"it is already {vertex.dtype.name.lower()}"
        for s in slots:
            allowed = self.allowed.get(s)
            if allowed is not None and self.target.type_str not in allowed:
                who = s.owner.op_type if isinstance(s.owner, ir.Node) else "graph"
                return f"the {who} schema does not allow {self.target.value} at this opset"
        node = vertex.node
        if node is not None:
            if vertex.policy is not None and vertex.policy.category is Category.NONFLOAT:
                return f"{node.op_type} is never touched: {vertex.policy.reason}"
            has_input = any(s.kind is SlotKind.NODE_IN for s in slots)
            if not has_input and node.op_type not in CONTROL_FLOW_OPS:
                attr = vertex.policy.dtype_attr if vertex.policy is not None else None
                if attr is None:
                    return f"{node.op_type} sets this output's type itself"
                if any(_tensor_dtype(v)[1] in FLOAT_TYPES for v in node.inputs if v is not None):
                    return f"{node.op_type} between float types is an explicit precision boundary"
        return None
