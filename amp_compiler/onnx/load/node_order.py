"""Nodes out of topological order, put in order: what onnx requires, and what some writers do not give.

onnx requires every node to come after the producers of what it reads; its checker refuses a graph
that does not, and so did amp-compiler (``invalid ONNX model: nodes are not in topological order``).
onnxruntime loads such graphs (it sorts them itself), and some tools write them: onnxruntime's own
``float16.convert_float_to_float16(keep_io_types=True, op_block_list=...)`` appends the Casts it inserts at
the end of the graph (sweep Z). Reordering the nodes changes nothing a node computes, so where the
checker's refusal was for the order alone (:class:`~amp_compiler.onnx.load.structure.NodeOrderError`: no
cycle, every tensor defined), the conversion sorts the graphs (:func:`in_topological_order`: a stable
order, each node as early as its inputs allow, the file's order kept among the others; subgraphs
included), checks the model again, and says so in one line. A sorted model pays nothing for it (the
sort runs on the checker's refusal only: its check alone took 0.3 s at 100,000 nodes).
"""

from __future__ import annotations

import heapq

import onnx

from amp_compiler.onnx.load.proto_walk import subgraphs
from amp_compiler.onnx.load.structure import used_names

__all__ = ["in_topological_order"]


def _in_order(graph: onnx.GraphProto, producer: dict[str, int]) -> bool:
    """Whether every node of ``graph`` comes after the producers of what it reads (one pass; a node's
    subgraphs are walked only where it has some)."""
    position = producer.get
    for i, node in enumerate(graph.node):
        if any(position(n, -1) > i for n in node.input):
            return False
        if node.attribute and any(True for _ in subgraphs(node)) and any(
                position(n, -1) > i for n in used_names(node)):
            return False
    return True


def _order(graph: onnx.GraphProto, outer: frozenset[str]) -> list[int] | None:
    """The positions of ``graph``'s nodes in a topological order (None where the file's is one already), or
    None where there is none (a cycle, or a tensor nothing defines: left to the checker)."""
    producer = {name: i for i, node in enumerate(graph.node) for name in node.output if name}
    if _in_order(graph, producer):
        return None
    defined = {v.name for v in graph.input} | {t.name for t in graph.initializer} | set(outer)
    defined |= {s.values.name for s in graph.sparse_initializer}
    needs: list[set[int]] = []
    for i, node in enumerate(graph.node):
        if any(n not in producer and n not in defined for n in node.input if n):
            return None
        needs.append({producer[n] for n in used_names(node) if n in producer and producer[n] != i})
    users: list[list[int]] = [[] for _ in graph.node]
    waiting = [len(d) for d in needs]
    for i, deps in enumerate(needs):
        for j in deps:
            users[j].append(i)
    ready = [i for i, n in enumerate(waiting) if n == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for k in users[i]:
            waiting[k] -= 1
            if waiting[k] == 0:
                heapq.heappush(ready, k)
    return order if len(order) == len(graph.node) else None


def _sort(graph: onnx.GraphProto, outer: frozenset[str]) -> int:
    """Sort ``graph`` and its subgraphs in place where needed; the number of graphs sorted."""
    sorted_graphs = 0
    order = _order(graph, outer)
    if order is not None:
        nodes = [graph.node[i] for i in order]
        kept = [onnx.NodeProto() for _ in nodes]
        for copy, node in zip(kept, nodes, strict=True):
            copy.CopyFrom(node)
        del graph.node[:]
        graph.node.extend(kept)
        sorted_graphs += 1
    scope = outer | {v.name for v in graph.input} | {t.name for t in graph.initializer}
    scope |= {name for node in graph.node for name in node.output if name}
    for node in graph.node:
        for sub in subgraphs(node):
            sorted_graphs += _sort(sub, frozenset(scope))
    return sorted_graphs


def in_topological_order(model: onnx.ModelProto) -> tuple[onnx.ModelProto, str]:
    """``model`` with every graph's nodes in a topological order (a sorted copy; ``model`` itself where
    each is in one already, or none exists), and a line saying what was sorted ("" where nothing was)."""
    if not model.HasField("graph"):
        return model, ""
    out = onnx.ModelProto()  # sorted in place: the conversion asks only once the checker refused the order
    out.CopyFrom(model)
    count = _sort(out.graph, frozenset())
    if not count:
        return model, ""
    where = "its graph" if count == 1 else f"{count} of its graphs"
    return out, f"nodes sorted into topological order in {where} (onnx requires it; nothing they compute changed)"

