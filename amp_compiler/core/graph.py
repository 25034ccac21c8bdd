"""The precision graph: the framework-neutral view of a model that the analysis passes read.

A *slot* is one place where a float tensor's dtype is fixed: an op's input or output, a graph input
or output. Slots that must share a dtype form one *vertex* (MatMul's inputs and output share the
type parameter ``T``; an If's outputs and both branches' outputs are one value). Edges go from the
vertex that defines a tensor to every vertex that uses it. Analysis chooses a precision per vertex;
where an edge joins two precisions, lowering inserts one Cast for that tensor and dtype. Constants
are not vertices: each vertex lists the constants it reads, and lowering converts them offline.

A frontend builds the graph from its model: :mod:`amp_compiler.onnx.graph.precision_graph` from an
onnx_ir model, :mod:`amp_compiler.fx.graph.precision_graph` from a torch.fx GraphModule. What the passes may read
of the frontend's objects is written down here as Protocols: :class:`OpView` (an operation),
:class:`ValueView` (a tensor) and :class:`SlotView` (a slot). Everything else a frontend keeps
(its nodes' other fields, how its slots name their owner) is for its own lowering.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from typing import Any, Generic, Protocol, TypeVar

import networkx as nx
import onnx_ir as ir

from amp_compiler.policy import Category, OpPolicy
from amp_compiler.targets import Target

__all__ = [
    "CONTROL_FLOW_OPS", "OpT", "OpView", "PrecisionGraph", "SlotKind", "SlotView", "StartT", "UnionFind", "ValueView",
    "Vertex",
    "count_readers", "dataflow", "index_readers", "integer_uses_from", "tensor_edges",
]

# ONNX's control-flow ops: their vertices carry values across their bodies (precision neutral).
CONTROL_FLOW_OPS = frozenset({"If", "Loop", "Scan"})


class SlotKind(enum.Enum):
    NODE_IN = "node input"
    NODE_OUT = "node output"
    GRAPH_IN = "graph input"
    GRAPH_OUT = "graph output"

    # Members are singletons: hash by identity, in C (Enum's default hashes the name in Python, and
    # every Slot lookup hashes its kind).
    __hash__ = object.__hash__


class ValueView(Protocol):
    """What the passes read of a tensor: its name (calibration ranges, cast sizes given by name)
    and its shape (the bytes a Cast of it moves). Implemented by ``onnx_ir.Value`` and
    :class:`amp_compiler.fx.graph.views.FxValue`."""

    @property
    def name(self) -> str | None: ...

    @property
    def shape(self) -> ir.Shape | None: ...


class OpView(Protocol):
    """What the passes read of an operation: its op type and domain (the policy table's key), its
    name (user block patterns, reasons) and its inputs (a table lookup's table is ``inputs[0]``;
    a constant input is one of the vertex's ``constants``). Implemented by ``onnx_ir.Node`` and
    :class:`amp_compiler.fx.graph.views.FxOp`. Ops are hashable: passes key dicts by them."""

    @property
    def op_type(self) -> str: ...

    @property
    def domain(self) -> str: ...

    @property
    def name(self) -> str | None: ...

    @property
    def inputs(self) -> Sequence[ValueView | None]: ...


class SlotView(Hashable, Protocol):
    """What the passes read of a slot: its kind, its index, its tensor and whether it defines it.
    Implemented by :class:`amp_compiler.onnx.graph.precision_graph.Slot` and
    :class:`amp_compiler.fx.graph.views.FxSlot`."""

    @property
    def kind(self) -> SlotKind: ...

    @property
    def index(self) -> int: ...

    @property
    def value(self) -> ValueView | None: ...

    @property
    def defines(self) -> bool:
        """True for slots that produce their tensor (op outputs, graph inputs)."""


SlotT = TypeVar("SlotT", bound=SlotView)
OpT = TypeVar("OpT", bound=OpView)
StartT = TypeVar("StartT")  # where an integer walk starts: an op, or a graph input (hashable)


@dataclasses.dataclass
class Vertex(Generic[SlotT, OpT]):
    """Slots that share one dtype, and what the analysis needs to know about them."""

    id: int
    slots: list[SlotT]
    node: OpT | None  # the op whose policy decides the category; None for graph inputs/outputs
    dtype: ir.DataType | None  # current element type (None: unknown)
    policy: OpPolicy | None
    fixed_reason: str | None = None  # why the dtype cannot change; None when it is a free choice
    untyped: bool = False  # no slot has a known element type: the vertex is left as it is
    # The constants it reads, as onnx_ir Values holding their tensors (the FX frontend wraps its
    # parameters and Python scalars so), for the range rules and lowering.
    constants: list[ir.Value] = dataclasses.field(default_factory=list)

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


@dataclasses.dataclass
class PrecisionGraph(Generic[SlotT, OpT]):
    """The vertices of a model, the edges between them, and the frontend's model they describe."""

    model: Any  # the frontend's model (an onnx_ir Model, a torch.fx GraphModule): lowering edits it
    target: Target
    vertices: list[Vertex[SlotT, OpT]]
    slot_vertex: dict[SlotT, int]
    digraph: nx.DiGraph  # vertex id -> vertex id, edge attribute "values": the tensors (ValueView) on the edge
    node_vertices: dict[OpT, list[int]]  # per op, the vertices of its slots
    unknown_ops: list[OpT]  # ops without a schema (ONNX) or a policy entry (FX)
    # Ops that read only the shape of their float inputs (the policy's ``shape_inputs``): those
    # inputs are no slots, so they take whatever float type their producer gives.
    shape_readers: list[OpT] = dataclasses.field(default_factory=list)
    # Ops no table knows whose precision the user declared (ONNX: ``custom_op_precision``), with the
    # element type declared: their float slots are fixed at it.
    declared_ops: dict[OpT, Any] = dataclasses.field(default_factory=dict)
    # Per selection op (the policy's ``selects``: TopK, ArgMax) whose indices reach an index input (the policy's
    # ``index_inputs``: Gather's indices, OneHot's, Equal's) through ops on integers: that reader and the input.
    index_readers: dict[OpT, tuple[OpT, int]] = dataclasses.field(default_factory=dict)
    # Ops computing a float from the value of integers that a count (the policy's ``positions``: Range, CumSum of a
    # mask) or an integer graph input holding positions (``core.positions.is_position_input``: position_ids,
    # cache_position) produced, through ops on integers (``count_readers``): BLOOM's Cast of cumsum(mask) - 1, the
    # Cast of position_ids. Their float results are positions, though no float vertex leads to them. Each frontend
    # fills it (onnx/graph/integer_flow.py, fx/graph/integer_flow.py: FX's pos.float() and mixed-type slopes * pos).
    counted: frozenset[OpT] = frozenset()

    def vertex_of(self, slot: SlotT) -> Vertex[SlotT, OpT] | None:
        vid = self.slot_vertex.get(slot)
        return None if vid is None else self.vertices[vid]


T = TypeVar("T", bound=Hashable)


class UnionFind(Generic[T]):
    """Disjoint sets of slots (the frontends group slots that share a dtype with it).

    ``parent`` maps every item to its parent; a root is its own parent. ``find`` compresses paths;
    ``union`` keeps the first set's root. A frontend may write ``parent`` directly to add a whole
    group at once as a star (every member's parent is the root), as the ONNX builder does for nodes
    that copy a template.
    """

    def __init__(self) -> None:
        self.parent: dict[T, T] = {}

    def add(self, item: T) -> None:
        self.parent.setdefault(item, item)

    def find(self, item: T) -> T:
        parent = self.parent
        root = item
        while parent[root] != root:
            root = parent[root]
        while parent[item] != root:
            parent[item], item = root, parent[item]
        return root

    def union(self, a: T, b: T) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[rb] = ra

    def groups(self) -> dict[T, list[T]]:
        """Every set by its root, members in the order they were added, sets in the order of their
        first member."""
        parent, find = self.parent, self.find
        members: dict[T, list[T]] = {}
        for item, up in parent.items():
            # Stars (every member's parent is the root) need no search.
            root = up if parent[up] is up else find(item)
            group = members.get(root)
            if group is None:
                members[root] = [item]
            else:
                group.append(item)
        return members


def tensor_edges(n_vertices: int, uses: Iterable[tuple[int, int, ValueView]]) -> nx.DiGraph:
    """The digraph over vertex ids ``0 .. n_vertices - 1`` with an edge from the vertex defining a
    tensor to each other vertex using it: ``uses`` gives (defining vertex, using vertex, tensor) per
    use, and each edge's ``"values"`` lists its tensors in that order (a vertex's own tensors make
    no edge)."""
    edges: dict[tuple[int, int], list[ValueView]] = {}
    for src, dst, value in uses:
        if src == dst:
            continue
        values = edges.get((src, dst))
        if values is None:
            edges[src, dst] = [value]
        else:
            values.append(value)
    digraph = nx.DiGraph()
    digraph.add_nodes_from(range(n_vertices))
    digraph.add_edges_from((src, dst, {"values": values}) for (src, dst), values in edges.items())
    return digraph


def integer_uses_from(starts: Iterable[StartT], integer_uses: Callable[[StartT | OpT], Iterable[tuple[OpT, int]]],
                      through: Callable[[OpT], bool]) -> Iterator[tuple[OpT, int]]:
    """Every use of integers computed from ``starts`` (ops, or graph inputs), breadth first: (reader, input index)
    per use of an integer output (``integer_uses(op)``) of a start or of a reader the walk went on through (those
    that ``through`` accepts), each op's uses once. The walk :func:`index_readers` and :func:`count_readers`
    share."""
    seen: set[StartT | OpT] = set(starts)
    frontier = list(seen)
    while frontier:
        nxt: list[StartT | OpT] = []
        for op in frontier:
            for reader, index in integer_uses(op):
                yield reader, index
                if reader not in seen and through(reader):
                    seen.add(reader)
                    nxt.append(reader)
        frontier = nxt


def index_readers(selections: Iterable[OpT], integer_uses: Callable[[OpT], Iterable[tuple[OpT, int]]],
                  policy: Callable[[OpT], OpPolicy | None]) -> dict[OpT, tuple[OpT, int]]:
    """Per op of ``selections`` whose integer results reach an input its reader's policy lists in
    ``index_inputs``: the first such (reader, input index), found breadth first through the ops that read
    integers (``integer_uses(op)``: (reader, input index) per use of one of ``op``'s integer or bool outputs).
    Selections whose indices only reach graph outputs, or only shapes, are absent."""
    found: dict[OpT, tuple[OpT, int]] = {}
    for selection in selections:
        for reader, index in integer_uses_from([selection], integer_uses, lambda _: True):
            entry = policy(reader)
            if entry is not None and index in entry.index_inputs:
                found[selection] = (reader, index)
                break
    return found


def count_readers(counts: Iterable[StartT], integer_uses: Callable[[StartT | OpT], Iterable[tuple[OpT, int]]],
                  policy: Callable[[OpT], OpPolicy | None], computes_float: Callable[[OpT], bool]) -> frozenset[OpT]:
    """The ops that compute a float from the value of integers counted by ``counts`` (ops the policy marks
    ``positions`` with integer results): found forwards through the ops that read integers
    (``integer_uses(op)``: (reader, input index) per use of one of ``op``'s integer outputs, bools excluded: a
    comparison of positions is a mask, not a position). A reader that ``computes_float`` is one of them when its
    policy calls it linear in its input (``signal``: a Cast, FX's mixed-type ``mul``) and the input is neither an
    index (``index_inputs``: a Gather of a learned table by position buckets is no position) nor a shape; the walk
    continues through readers with integer results only."""
    found: set[OpT] = set()
    for reader, index in integer_uses_from(counts, integer_uses, lambda op: not computes_float(op)):
        if computes_float(reader):
            entry = policy(reader)
            if (entry is not None and entry.signal and index not in entry.index_inputs
                    and index not in entry.shape_inputs):
                found.add(reader)
    return frozenset(found)


def dataflow(graph: PrecisionGraph) -> nx.DiGraph:
    """What is computed from what: ``graph.digraph`` plus, for an op whose inputs and outputs lie in
    different vertices (a Cast or ``.to(float32)`` between two float types, an op with fixed-type
    arguments), an edge from each of its vertices holding an input to each other one holding an output.

    The tensor edges alone stop at such an op: its output vertex has no predecessor, as if computed from
    integers or constants alone (``inv_freq[None, :, None].float()`` in an FX graph looked like a raw
    position, and the path through it was lost). Passes that follow values through ops (signal paths,
    phase arguments) walk this graph; it is a new graph, ``graph.digraph`` is unchanged."""
    flow = graph.digraph.copy()
    vertices = graph.vertices
    for op, vids in graph.node_vertices.items():
        if len(vids) < 2:
            continue
        own = [vertices[v] for v in vids if vertices[v].node is op]
        ins = [v.id for v in own if any(s.kind is SlotKind.NODE_IN for s in v.slots)]
        outs = [v.id for v in own if any(s.kind is SlotKind.NODE_OUT for s in v.slots)]
        flow.add_edges_from((a, b) for a in ins for b in outs if a != b)
    return flow
