"""The ONNX frontend's precision graph: the vertices and edges of an onnx_ir model, from its op schemas.

Slots (:class:`~amp_compiler.onnx.ir.slots.Slot`) that must share a dtype form one vertex:

- inputs and outputs of a node that share a schema type parameter (``T`` of MatMul);
- input-only type parameters of a node (BatchNormalization's ``T1``/``T2`` statistics) follow the
  node's main group, so kernels templated on one type find a match;
- the values that If/Loop/Scan pass across their bodies (:mod:`amp_compiler.onnx.graph.control_flow`).

Fixed-type inputs, groups whose schema does not allow the target type at the model's opset, and
slots of ops without a schema keep their dtype (:mod:`amp_compiler.onnx.graph.fixed_reasons`). Constants
(initializers and Constant nodes), absent optional values, and inputs an op reads only the shape of
(the policy's ``shape_inputs``: they take whatever float type their producer gives) are not slots.

Building the graph reads the model and never edits it.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Iterator, Mapping
from typing import Any

import onnx_ir as ir

from amp_compiler.core.graph import (
    CONTROL_FLOW_OPS,
    PrecisionGraph,
    SlotKind,
    UnionFind,
    Vertex,
    tensor_edges,
)
from amp_compiler.dtypes import FLOAT_TYPES, schema_type, short_name
from amp_compiler.onnx.graph.control_flow import carried_values
from amp_compiler.onnx.graph.fixed_reasons import fixed_reason
from amp_compiler.onnx.graph.integer_flow import counted_of, index_readers_of
from amp_compiler.onnx.ir.slots import (
    GRAPH_IN,
    GRAPH_OUT,
    NODE_IN,
    NODE_OUT,
    Slot,
    attribute_value,
    constant_input,
    is_absent,
    shape_codes,
    slot_order,
    tensor_dtype,
)
from amp_compiler.onnx.ir.walk import is_constant, iter_graphs
from amp_compiler.onnx.load.text import quote
from amp_compiler.policy import OpPolicy, PolicyTable, schemas
from amp_compiler.targets import Target

__all__ = ["OnnxPrecisionGraph", "build_precision_graph"]

_FLOAT_TYPE_STRS = frozenset(schema_type(t) for t in FLOAT_TYPES)
# The types a declared custom op's slots are retyped from (a double stays double).
_DECLARABLE = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16})

# The precision graph of an onnx_ir model: its slots are Slots, its ops onnx_ir Nodes.
OnnxPrecisionGraph = PrecisionGraph[Slot, ir.Node]


def build_precision_graph(
    model: ir.Model, target: Target, policy: PolicyTable, keep_io_types: bool | Collection[str] = True,
    declared: Mapping[tuple[str, str], ir.DataType] | None = None,
) -> OnnxPrecisionGraph:
    """Build the precision graph of ``model`` (which must carry inferred types). ``keep_io_types``:
    whether the main graph's inputs and outputs keep their types, or the names of those that do.
    ``declared``: the type of the float slots of ops without a schema, by (domain, op), as the user
    declared it (:mod:`amp_compiler.onnx.graph.custom_ops`); other such ops keep their types."""
    return _Builder(model, target, policy, keep_io_types, declared or {}).build()


class _Builder:
    def __init__(
        self, model: ir.Model, target: Target, policy: PolicyTable, keep_io: bool | Collection[str],
        declared: Mapping[tuple[str, str], ir.DataType],
    ):
        self.model = model
        self.target = target
        self.policy = policy
        self.keep_io = keep_io
        self.declared = declared
        self.type_str = target.type_str
        self.uf: UnionFind[Slot] = UnionFind()
        # Per slot: the types its schema allows (None: no schema, the slot is fixed).
        self.allowed: dict[Slot, frozenset[str] | None] = {}
        self.slot_node: dict[Slot, ir.Node | None] = {}
        self.slot_dtype: dict[Slot, ir.DataType | None] = {}  # element type when the graph was built
        self.fixed: dict[Slot, str] = {}  # slots fixed for a reason of their own
        self.tied: set[Slot] = set()  # body I/O slots tied to a control-flow node
        self.unknown_ops: list[ir.Node] = []
        self.shape_readers: list[ir.Node] = []
        # Memos: per (domain, op) its signature and policy; per (domain, op, is_input, index) its
        # formal's allowed types, type key and whether it can be float. Pure functions of their keys.
        self._ops: dict[tuple[str, str], tuple[schemas.OpSignature | None, OpPolicy | None]] = {}
        self._formals: dict[tuple, tuple] = {}
        # Per node shape (see _add_node) its template; per group root slot copied from a template,
        # (the template's key, the root's index).
        self._templates: dict[tuple, tuple] = {}
        self._template_group: dict[Slot, tuple] = {}

    # -- slots ---------------------------------------------------------------------------------
    def _graph_slot(self, kind: SlotKind, graph: ir.Graph, index: int) -> Slot | None:
        """The slot of a graph input or output holding a float (or untyped) tensor, else None."""
        value = graph.inputs[index] if kind is GRAPH_IN else graph.outputs[index]
        is_tensor, dtype = tensor_dtype(value)
        if not is_tensor or (dtype is not None and dtype not in FLOAT_TYPES):
            return None
        slot = Slot(kind, graph, index)
        self.uf.add(slot)
        self.allowed[slot] = None
        self.slot_node[slot] = None
        self.slot_dtype[slot] = dtype
        if dtype is None:
            self.fixed[slot] = "its element type is unknown (shape inference gave none)"
        return slot

    def _opset(self, domain: str) -> int:
        return schemas.opset_in(self.model.opset_imports, domain)

    def _op(self, domain: str, op_type: str) -> tuple[schemas.OpSignature | None, OpPolicy | None]:
        key = (domain, op_type)
        found = self._ops.get(key)
        if found is None:
            found = self._ops[key] = (
                schemas.lookup(domain, op_type, self._opset(domain)),
                self.policy.get(domain, op_type),
            )
        return found

    def _formal(self, sig: schemas.OpSignature, op: tuple[str, str], is_input: bool, i: int) -> tuple:
        """(allowed types, type key, can be float, is a fixed-type formal) of one position."""
        key = (op, is_input, i)
        found = self._formals.get(key)
        if found is None:
            allowed = sig.allowed_types(is_input, i)
            type_key = sig.type_key(is_input, i)
            fixed_type = type_key is not None and not isinstance(type_key, tuple) and type_key not in sig.allowed
            found = self._formals[key] = (allowed, type_key, bool(allowed & _FLOAT_TYPE_STRS), fixed_type)
        return found

    # -- nodes ---------------------------------------------------------------------------------
    def _add_node(self, node: ir.Node) -> None:
        """The node's slots and how they group, from a template per node shape (op and the kind of
        each input and output): nodes of one shape group alike, so the first one is worked out by
        :meth:`_add_node_slow` and the others copy it. Control-flow nodes always take the slow path
        (they tie slots of their bodies)."""
        op_type, domain = node.op_type, node.domain
        if op_type == "Constant" and schemas.is_onnx_domain(domain):
            return  # a constant source, converted offline by lowering
        if op_type in CONTROL_FLOW_OPS:
            self._add_node_slow(node)
            return
        policy = self._op(domain, op_type)[1]
        case = (policy.case_index(functools.partial(attribute_value, node), functools.partial(constant_input, node))
                if policy is not None and policy.when else None)
        key = (domain, op_type, case, shape_codes(node.inputs), shape_codes(node.outputs))
        template = self._templates.get(key)
        if template is None:
            self._templates[key] = self._template(node, self._add_node_slow(node))
            return
        positions, infos, roots, unknown, reads_shape = template
        parent, allowed_of, slot_node, slot_dtype, fixed = (
            self.uf.parent, self.allowed, self.slot_node, self.slot_dtype, self.fixed
        )
        slots = [Slot(kind, node, i) for kind, i in positions]
        for slot, (allowed, dtype, reason), r in zip(slots, infos, roots, strict=True):
            parent[slot] = slots[r]
            allowed_of[slot] = allowed
            slot_node[slot] = node
            slot_dtype[slot] = dtype
            if reason is not None:
                fixed[slot] = reason
        for r in set(roots):
            self._template_group[slots[r]] = (key, r)
        if unknown:
            self.unknown_ops.append(node)
        if reads_shape:
            self.shape_readers.append(node)

    def _template(self, node: ir.Node, created: list[Slot]) -> tuple:
        """What :meth:`_add_node_slow` did for ``node``, relative to the node: per slot its position,
        (allowed types, dtype, fixed reason), and the index of its group's root."""
        find = self.uf.find
        index = {s: k for k, s in enumerate(created)}
        roots = tuple(index[find(s)] for s in created)
        return (
            tuple((s.kind, s.index) for s in created),
            tuple((self.allowed[s], self.slot_dtype[s], self.fixed.get(s)) for s in created),
            roots,
            bool(self.unknown_ops) and self.unknown_ops[-1] is node,
            bool(self.shape_readers) and self.shape_readers[-1] is node,
        )

    def _add_node_slow(self, node: ir.Node) -> list[Slot]:
        """Create the node's slots and group them by the schema's type parameters; returns them."""
        op_type, domain = node.op_type, node.domain
        op = (domain, op_type)
        sig, policy = self._op(domain, op_type)
        if sig is None:
            self.unknown_ops.append(node)
        parent, allowed_of, slot_node, slot_dtype, fixed = (
            self.uf.parent, self.allowed, self.slot_node, self.slot_dtype, self.fixed
        )
        formal = self._formal
        tensor_type = ir.TensorType
        groups: dict[object, list[Slot]] = {}
        group_has_output: dict[object, bool] = {}
        created: list[Slot] = []
        has_container = False  # reads or makes a sequence/optional: its tensors keep their types
        shape_inputs = policy.shape_inputs if policy is not None else ()
        for is_input, values in ((True, node.inputs), (False, node.outputs)):
            kind = NODE_IN if is_input else NODE_OUT
            for i, v in enumerate(values):
                if v is None or (v.name == "" and is_absent(v)):
                    continue
                # The value's element type (as _tensor_dtype): not a tensor -> no slot.
                vtype = v.type
                if vtype is None:
                    dtype = None
                elif isinstance(vtype, tensor_type):
                    dtype = vtype.dtype
                    if dtype not in FLOAT_TYPES:
                        continue
                else:
                    has_container = True
                    continue
                if is_input and i in shape_inputs:
                    # Only its shape is read: any float type will do, the producer's included.
                    if not self.shape_readers or self.shape_readers[-1] is not node:
                        self.shape_readers.append(node)
                    continue
                if sig is not None:
                    allowed, key, can_be_float, fixed_type = formal(sig, op, is_input, i)
                    if dtype is None and not can_be_float:
                        continue  # untyped, but the schema says it cannot be float
                else:
                    allowed = None
                slot = Slot(kind, node, i)
                parent[slot] = slot
                allowed_of[slot] = allowed
                slot_node[slot] = node
                slot_dtype[slot] = dtype
                created.append(slot)
                if dtype is None:
                    fixed[slot] = "its element type is unknown (shape inference gave none)"
                if sig is None:
                    declared = self.declared.get((domain, op_type))
                    if declared is not None and dtype in _DECLARABLE:
                        # a custom op whose precision the user declared: its float slots take it
                        slot_dtype[slot] = declared
                        fixed[slot] = (
                            f"{short_name(declared)} as the user declared for {domain or 'ai.onnx'}::{op_type} "
                            "(custom_op_precision)"
                        )
                    else:
                        fixed[slot] = f"no schema is known for {domain or 'ai.onnx'}::{op_type}"
                    continue
                if key is None:
                    fixed[slot] = "the schema has no formal parameter at this position"
                    continue
                if fixed_type:
                    continue  # a fixed-type formal ("tensor(float)"): its own, fixed, group
                members = groups.get(key)
                if members is None:
                    groups[key] = [slot]
                    group_has_output[key] = not is_input
                else:
                    members.append(slot)
                    if not is_input:
                        group_has_output[key] = True
        if has_container and op_type not in CONTROL_FLOW_OPS:
            # Sequence/optional element types are not followed through the containers: the
            # tensors going in and out of them keep their types.
            for slot in created:
                fixed.setdefault(slot, f"{op_type} puts tensors into or takes them out of a sequence/optional")
        if not groups:
            if op_type in CONTROL_FLOW_OPS and schemas.is_onnx_domain(domain):
                self._tie_control_flow(node)
            return created
        union = self.uf.union
        for slots in groups.values():
            for s in slots[1:]:
                union(slots[0], s)
        # Input-only type parameters follow the node's main group (the first one with an output).
        # Not for conversion ops (Cast, CastLike: ``dtype_attr``), whose input and output types differ.
        main = next((k for k, has_out in group_has_output.items() if has_out), None)
        converts = policy is not None and policy.dtype_attr is not None
        # Output-only groups whose type parameter belongs to an input that is absent (LinearAttention's
        # present_state without past_state) take the main group's type in onnx's type inference.
        if main is not None and len(groups) > 1 and not isinstance(main, tuple) and not converts:
            for key, slots in groups.items():
                if key == main or isinstance(key, tuple):
                    continue
                has_input = any(s.kind is NODE_IN for s in slots)
                input_absent = not has_input and sig is not None and any(f.type_str == key for f in sig.inputs)
                if (has_input and not group_has_output[key]) or input_absent:
                    if self.target.type_str in (self.allowed[slots[0]] or ()):
                        self.uf.union(groups[main][0], slots[0])
        if op_type in CONTROL_FLOW_OPS and schemas.is_onnx_domain(domain):
            self._tie_control_flow(node)
        return created

    def _tie_control_flow(self, node: ir.Node) -> None:
        """Union the slots of each value the node passes across its bodies (see
        :func:`~amp_compiler.onnx.graph.control_flow.carried_values`); the bodies' slots are recorded as tied."""
        parent = self.uf.parent
        for group in carried_values(node, self._opset("")):
            present = [s for s in group if s in parent]
            for s in present:
                if s.kind is GRAPH_IN or s.kind is GRAPH_OUT:
                    self.tied.add(s)
            for s in present[1:]:
                self.uf.union(present[0], s)

    # -- graph I/O -----------------------------------------------------------------------------
    def _add_graph_io(self, graph: ir.Graph, is_main: bool) -> None:
        for is_input, values in ((True, graph.inputs), (False, graph.outputs)):
            kind = SlotKind.GRAPH_IN if is_input else SlotKind.GRAPH_OUT
            for i in range(len(values)):
                slot = self._graph_slot(kind, graph, i)
                if slot is None:
                    continue
                if is_main and self.keep_io is True:
                    self.fixed[slot] = "graph inputs and outputs keep their dtype (keep_io_types)"
                elif is_main and not isinstance(self.keep_io, bool) and values[i].name in self.keep_io:
                    what = f"graph {'input' if is_input else 'output'} {quote(values[i].name or '')}"
                    self.fixed[slot] = f"{what} keeps its dtype (keep_io_types names it)"
                elif is_main and not is_input and (
                    is_constant(values[i]) or values[i].is_graph_input()
                ):
                    self.fixed[slot] = "a graph output that is a constant or a graph input keeps its dtype"
                elif is_main and is_input and values[i].is_graph_output():
                    self.fixed[slot] = "a graph input that is also a graph output keeps its dtype and name"
                elif is_main and is_input and values[i].const_value is not None:
                    self.fixed[slot] = "a graph input with an initializer (an overridable default) keeps its dtype"

    # -- assemble ------------------------------------------------------------------------------
    def build(self) -> OnnxPrecisionGraph:
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
            for slot in [Slot(GRAPH_IN, g, i) for i in range(len(g.inputs))] + [
                Slot(GRAPH_OUT, g, i) for i in range(len(g.outputs))
            ]:
                if slot in self.uf.parent and slot not in self.tied:
                    self.fixed[slot] = "a subgraph input/output whose owner op is not If/Loop/Scan"

        members = self.uf.groups()
        vertices: list[Vertex] = []
        slot_vertex: dict[Slot, int] = {}
        node_vertices: dict[ir.Node, list[int]] = {}
        template_group = self._template_group
        facts: dict[tuple, tuple] = {}  # per template group: (slot order, dtype, policy, fixed reason, untyped)
        for root, slots in members.items():
            vid = len(vertices)
            group = template_group.get(root)
            known = facts.get(group) if group is not None else None
            if known is not None and len(slots) == len(known[0]):
                # A group as its template made it, with nothing tied to it: as the template's was.
                order, dtype, policy, reason, untyped = known
                op: Any = root.owner  # a template's group: its root is a node's slot
                vertex = Vertex(vid, [slots[k] for k in order], op, dtype, policy, reason, untyped)
            else:
                made = list(slots)
                vertex = self._make_vertex(vid, slots)
                if group is not None and group not in facts:
                    order = tuple(made.index(s) for s in vertex.slots)
                    facts[group] = (order, vertex.dtype, vertex.policy, vertex.fixed_reason, vertex.untyped)
            vertices.append(vertex)
            for s in slots:
                slot_vertex[s] = vid
                kind = s.kind
                if kind is NODE_IN or kind is NODE_OUT:
                    owner: Any = s.owner  # a node
                    lst = node_vertices.get(owner)
                    if lst is None:
                        node_vertices[owner] = [vid]
                    elif vid not in lst:
                        lst.append(vid)

        digraph = tensor_edges(len(vertices), self._uses(slot_vertex, vertices))
        declared = {n: self.declared[key] for n in self.unknown_ops if (key := (n.domain, n.op_type)) in self.declared}
        return PrecisionGraph(
            self.model, self.target, vertices, slot_vertex, digraph, node_vertices, self.unknown_ops,
            self.shape_readers, declared, index_readers_of(graphs, self._policy), counted_of(graphs, self._policy),
        )

    def _policy(self, node: ir.Node) -> OpPolicy | None:
        return self._op(node.domain, node.op_type)[1]

    @staticmethod
    def _uses(slot_vertex: dict[Slot, int], vertices: list[Vertex]) -> Iterator[tuple[int, int, ir.Value]]:
        """(defining vertex, using vertex, tensor) per use of a tensor that a slot defines; the
        constants a vertex reads are listed on it instead."""
        defining: dict[ir.Value | None, int] = {}
        uses: list[tuple[ir.Value | None, int]] = []
        for (kind, owner, index), vid in slot_vertex.items():
            if kind is NODE_OUT:
                defining[owner.outputs[index]] = vid
            elif kind is GRAPH_IN:
                defining[owner.inputs[index]] = vid
            else:
                uses.append((owner.inputs[index] if kind is NODE_IN else owner.outputs[index], vid))
        for value, vid in uses:
            src = defining.get(value)
            if value is None:
                continue  # slots hold tensors: not reached
            if src is not None:
                yield src, vid, value
            elif is_constant(value):  # constants have no defining slot (nor do tensors of untracked types)
                vertices[vid].constants.append(value)

    def _make_vertex(self, vid: int, slots: list[Slot]) -> Vertex:
        if len(slots) > 1:
            slots.sort(key=slot_order)
        node = None
        slot_node = self.slot_node
        for s in slots:
            owner_node = slot_node.get(s)
            if owner_node is not None and (node is None or owner_node.op_type in CONTROL_FLOW_OPS):
                node = owner_node
        policy = self._op(node.domain, node.op_type)[1] if node is not None else None
        if policy is not None and policy.when and node is not None:
            # the [[op.when]] case its attributes and constant inputs select
            policy = policy.resolve(functools.partial(attribute_value, node), functools.partial(constant_input, node))
        slot_dtype = self.slot_dtype
        dtypes = {d for s in slots if (d := slot_dtype[s]) is not None}
        vertex = Vertex(vid, slots, node, next(iter(dtypes)) if len(dtypes) == 1 else None, policy)
        vertex.fixed_reason = fixed_reason(vertex, slots, dtypes, self.fixed, self.allowed, self.target)
        vertex.untyped = not dtypes
        return vertex

