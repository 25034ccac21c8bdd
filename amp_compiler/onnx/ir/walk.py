"""Walks over onnx_ir models: every graph with its subgraphs, their nodes in order, and which values are constants."""

from __future__ import annotations

from collections.abc import Iterator

import onnx_ir as ir

from amp_compiler.policy.schemas import is_onnx_domain

__all__ = ["home_graph", "is_constant", "iter_graphs", "node_order"]


def iter_graphs(graph: ir.Graph) -> Iterator[ir.Graph]:
    """The graph and all its subgraphs, depth first, parents before children."""
    yield graph
    for node in graph:
        attrs = node.attributes.data  # the plain dict under the UserDict: iterating it is C-speed
        if not attrs:
            continue
        for attr in attrs.values():
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
    return producer is not None and producer.op_type == "Constant" and is_onnx_domain(producer.domain)


def node_order(model: ir.Model) -> list[ir.Node]:
    """Every node of every graph, in the order decisions are reported (and ``pinned_nodes`` counts)."""
    return [node for g in iter_graphs(model.graph) for node in g]


def home_graph(item: ir.Node | ir.Value) -> ir.Graph:
    """The graph a node or value belongs to (where a pass inserts beside it)."""
    graph = item.graph
    if graph is None:
        raise ValueError(f"{item!r} belongs to no graph")
    return graph
