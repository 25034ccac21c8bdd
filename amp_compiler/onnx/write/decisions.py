"""Per-node decisions: the precision of every node of a converted ONNX model, with its rule and reason."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import onnx_ir as ir

from amp_compiler.core.decision import NodeDecision
from amp_compiler.core.graph import SlotKind
from amp_compiler.core.plan import PrecisionPlan, Rule
from amp_compiler.dtypes import FLOAT_TYPES, MIXED, NO_FLOAT, short_name
from amp_compiler.onnx.graph.precision_graph import OnnxPrecisionGraph
from amp_compiler.onnx.ir.slots import Slot
from amp_compiler.onnx.ir.walk import is_constant, iter_graphs
from amp_compiler.passes.onnx.lower import CastRecord

__all__ = ["node_decisions"]


def _dtype_names(values: Iterable[ir.Value | None]) -> list[str]:
    """Per value: "fp16", "int64", ... ("" for an absent optional value, "?" for an unknown type)."""
    names = []
    for value in values:
        if value is None:
            names.append("")
            continue
        vtype = value.type
        if vtype is None:
            names.append("?")
        elif isinstance(vtype, ir.TensorType):
            names.append(short_name(vtype.dtype))
        else:
            names.append(str(vtype))
    return names


def _user_name(slot: Slot) -> str:
    owner = slot.owner
    if slot.kind is SlotKind.GRAPH_OUT or not isinstance(owner, ir.Node):
        return f"graph output {slot.index}"
    return owner.name or owner.op_type


def node_decisions(
    graph: OnnxPrecisionGraph, plan: PrecisionPlan, model: ir.Model, casts: Iterable[CastRecord],
    input_nodes: Sequence[ir.Node], renamed: Mapping[str, str] | None = None,
) -> list[NodeDecision]:
    """One decision per node of the lowered ``model``, in :func:`~amp_compiler.onnx.ir.walk.node_order`:
    the decision of the vertex that decides the node (the one vertex of its slots, or its first
    output's), the Casts lowering inserted (``casts``), constants and nodes without float data.
    ``input_nodes``: the input model's nodes in order, whose positions the decisions carry (``index``).
    ``renamed``: tensors renamed after lowering, by their new name: the name a Cast's reason gives
    (Tensor Core padding hands a padded output's name to the Slice that now feeds the Casts)."""
    renamed = renamed or {}
    inserted = {id(c.node): c for c in casts}
    shape_readers = {id(node) for node in graph.shape_readers}
    positions = {id(node): i for i, node in enumerate(input_nodes)}
    paths = {id(model.graph): "main"}
    out: list[NodeDecision] = []
    decisions, notes = plan.decisions, plan.notes
    rule_ids = {rule: rule.value for rule in Rule}
    for g in iter_graphs(model.graph):
        gpath = paths.get(id(g), "?")
        node_vertices, slot_vertex = graph.node_vertices, graph.slot_vertex
        for node in g:
            attributes = node.attributes.data  # the dict under the UserDict: iterates at C speed
            for name, attr in attributes.items() if attributes else ():
                subs = [attr.value] if attr.type == ir.AttributeType.GRAPH else (
                    list(attr.value) if attr.type == ir.AttributeType.GRAPHS else []
                )
                for k, sub in enumerate(subs):
                    suffix = f"{name}" if len(subs) == 1 else f"{name}[{k}]"
                    paths[id(sub)] = f"{gpath}/{node.name or node.op_type}/{suffix}"
            vids = node_vertices.get(node)
            main = None
            if vids and len(vids) == 1:
                main = vids[0]
            elif vids:  # a node without vertices has no slots
                for kind, values in ((SlotKind.NODE_OUT, node.outputs), (SlotKind.NODE_IN, node.inputs)):
                    for i in range(len(values)):
                        vid = slot_vertex.get(Slot(kind, node, i))
                        if vid is not None:
                            main = vid
                            break
                    if main is not None:
                        break
            if main is None:
                if id(node) in inserted:
                    cast = inserted[id(node)]
                    users = ", ".join(sorted({_user_name(s) for s in cast.users}))
                    source = cast.source.name or ""
                    precision, rule, reason = (
                        short_name(cast.to),
                        Rule.LOWERING_CAST.value,
                        f"Cast inserted: {users} need(s) {renamed.get(source, source)!r} as {short_name(cast.to)}",
                    )
                elif node.op_type == "Constant" and node.outputs and is_constant(node.outputs[0]):
                    dtype = node.outputs[0].dtype
                    precision, rule, reason = (
                        short_name(dtype) if dtype in FLOAT_TYPES else NO_FLOAT,
                        Rule.CONSTANT.value,
                        "constant: converted offline for the precision its users need",
                    )
                elif id(node) in shape_readers:
                    precision, rule, reason = (
                        NO_FLOAT, Rule.SHAPE_ONLY.value,
                        "reads only the shape of its float input: takes it in any float type, without a Cast",
                    )
                else:
                    precision, rule, reason = NO_FLOAT, Rule.NONFLOAT.value, "no float inputs or outputs"
            else:
                decision = decisions[main]
                if not vids or len(vids) == 1 or len({decisions[v].dtype for v in vids}) == 1:
                    precision = short_name(decision.dtype)
                else:
                    precision = MIXED
                rule, reason = rule_ids[decision.rule], decision.reason
                if main in notes:
                    reason = f"{reason}; {notes[main]}"
            out.append(
                NodeDecision(
                    gpath, node.name or "", node.op_type, node.domain or "ai.onnx", precision, rule, reason,
                    _dtype_names(node.inputs), _dtype_names(node.outputs), positions.get(id(node)),
                )
            )
    return out


