"""Graph structure, said precisely: a cycle, a tensor read but never defined or produced twice, an
output listed twice or produced by nothing, nodes out of topological order (subgraphs included).

onnx's checker finds these faults but names them tersely; :mod:`amp_compiler.onnx.load.validate` calls
:func:`check_graph_structure` once the checker has refused a model, to say which nodes are at fault.
"""

from __future__ import annotations

from collections.abc import Iterator

import onnx

from amp_compiler.errors import ModelLoadError
from amp_compiler.onnx.load.proto_walk import iter_proto_graphs, subgraphs
from amp_compiler.onnx.load.text import node_label, quote

__all__ = ["NodeOrderError", "check_graph_structure", "check_output_names", "used_names"]


class NodeOrderError(ModelLoadError):
    """A graph's nodes are not in topological order, and form no cycle: a fault the conversion mends
    (:func:`amp_compiler.onnx.load.node_order.in_topological_order`)."""


def used_names(node: onnx.NodeProto) -> Iterator[str]:
    """Every tensor name a node reads, including those its subgraphs read from outer scopes."""
    yield from (n for n in node.input if n)
    for sub in subgraphs(node):
        for g in iter_proto_graphs(sub):
            for inner in g.node:
                yield from (n for n in inner.input if n)
            for out in g.output:
                yield out.name


def check_graph_structure(graph: onnx.GraphProto, outer: frozenset[str], origin: str) -> None:
    """Precise messages for the faults onnx's checker reports tersely (cycles, undefined tensors).

    ``outer``: the names visible from enclosing graphs (empty for the main graph).
    """
    where = f"{origin}: invalid ONNX model" + (f" (in subgraph {quote(graph.name)})" if outer else "")
    defined: set[str] = set()
    for v in graph.input:
        defined.add(v.name)
    for t in graph.initializer:
        defined.add(t.name)
    for s in graph.sparse_initializer:
        defined.add(s.values.name)
    producer: dict[str, int] = {}
    for i, node in enumerate(graph.node):
        for name in node.output:
            if not name:
                continue
            if name in producer or name in defined:
                first = (
                    node_label(graph.node[producer[name]], producer[name])
                    if name in producer
                    else "a graph input or initializer"
                )
                raise ModelLoadError(
                    f"{where}: tensor {quote(name)} is produced twice ({first} and {node_label(node, i)}); "
                    "every tensor name must have one producer"
                )
            producer[name] = i
    check_output_names(graph, origin, subgraph=bool(outer))
    for v in graph.output:
        if v.name not in producer and v.name not in defined and v.name not in outer:
            raise ModelLoadError(f"{where}: graph output {quote(v.name)} is not produced by any node")
    visible = defined | outer
    unsorted = False
    position = producer.get
    for i, node in enumerate(graph.node):
        for name in node.input:
            if not name:
                continue
            j = position(name)
            if j is None:
                if name not in visible:
                    raise ModelLoadError(
                        f"{where}: {node_label(node, i)} reads tensor {quote(name)}, which no node, graph input "
                        "or initializer defines"
                    )
            elif j >= i:
                unsorted = True
        if node.attribute and not unsorted and any(True for _ in subgraphs(node)):
            unsorted = any(position(n, -1) >= i for n in used_names(node))
    if unsorted:
        # The dependencies (node -> producers of what it reads, in its subgraphs too) only to name the fault.
        deps = [{producer[n] for n in used_names(node) if n in producer} for node in graph.node]
        cycle = _find_cycle(deps)
        if cycle is not None:
            path = " -> ".join(node_label(graph.node[j], j) for j in cycle[:6])
            more = " -> ..." if len(cycle) > 6 else ""
            raise ModelLoadError(f"{where}: the graph has a cycle: {path}{more} -> back to the first")
        raise NodeOrderError(
            f"{where}: nodes are not in topological order (ONNX requires every node to come after the "
            "producers of its inputs)"
        )
    scope = frozenset(visible | set(producer))
    for node in graph.node:
        for sub in subgraphs(node):
            check_graph_structure(sub, scope, origin)


def _find_cycle(deps: list[set[int]]) -> list[int] | None:
    """One cycle of the dependency graph (node -> nodes it reads from), or None. Iterative DFS."""
    state = [0] * len(deps)  # 0 unseen, 1 on the stack, 2 done
    for start in range(len(deps)):
        if state[start]:
            continue
        stack = [(start, iter(sorted(deps[start])))]
        path = [start]
        state[start] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                stack.pop()
                path.pop()
                state[node] = 2
            elif state[nxt] == 1:
                cycle = path[path.index(nxt):]
                return list(reversed(cycle))  # in data-flow order
            elif state[nxt] == 0:
                state[nxt] = 1
                path.append(nxt)
                stack.append((nxt, iter(sorted(deps[nxt]))))
    return None


def check_output_names(graph: onnx.GraphProto, origin: str, subgraph: bool) -> None:
    """Refuse a graph that lists an output name twice: onnx's checker and onnxruntime accept it (hummingbird's
    SVC export lists its probabilities twice), but the conversion writes, casts and measures each output once,
    by name; the message says so, and how to drop the repeat."""
    seen: set[str] = set()
    for i, v in enumerate(graph.output):
        if v.name in seen:
            where = f"{origin}: unsupported model" + (f" (in subgraph {quote(graph.name)})" if subgraph else "")
            raise ModelLoadError(
                f"{where}: graph output {quote(v.name)} is listed twice (onnx's checker accepts it; amp-compiler "
                f"converts each output once): drop the repeat first, e.g. del model.graph.output[{i}]")
        seen.add(v.name)
