"""Cut a model into a chain of pieces, consecutive runs of its nodes, that compute what it computes.

Calibration exposes every float tensor of the main graph as an output, and onnxruntime keeps every
graph output alive until the run ends: one run of such a model holds all its activations at once.
Run as a chain (:func:`amp_compiler.runtime.child.run_chain`), piece after piece, only one piece's
tensors and the values that cross to later pieces are alive. Guarantees of :func:`chain_pieces`:

- the pieces' nodes are the main graph's, in its order, each in exactly one piece, unchanged;
- a piece's inputs are the graph inputs and earlier pieces' outputs it uses (its nodes' subgraphs'
  references to outer-scope names included), of their element types and with the shapes ``shapes``
  gives them (those that hold for every sample), else none; its initializers, those its nodes use;
- a piece's outputs are the names of ``exposed`` it produces, then those a later piece uses;
- with ``sizes`` (bytes per tensor, where known), a piece's outputs of known size hold at most
  ``budget`` bytes together (or it is one node), and a piece holds at most :data:`MAX_NODES` nodes;
  without, :data:`NODES_PER_PIECE` nodes; in both cases more where a cut would let a value of
  ``joined`` cross (values onnxruntime cannot hand over: bfloat16, float8): none crosses;
- where a cut cannot be typed (a value crossing between pieces whose type onnx's shape inference did
  not find), a graph output is no node's output, or the graph has initializers that are also inputs
  or sparse initializers, there is one piece: the model itself.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence

import onnx
import onnx.helper as oh

__all__ = ["MAX_NODES", "NODES_PER_PIECE", "chain_pieces", "live_bytes"]

#: Nodes per piece: a piece holds its nodes' outputs at once. Small enough that a piece's tensors
#: are a few of the model's live activations; large enough that a piece's run is not mostly
#: onnxruntime's per-run cost (benchmarks.calibration_cost measures both).
NODES_PER_PIECE = 6
#: Nodes per piece at most when pieces are cut by size (tensors of unknown size count for nothing).
MAX_NODES = 48


def live_bytes(model: onnx.ModelProto, sizes: Mapping[str, int]) -> int:
    """The largest sum of ``sizes`` alive at once in one run of the main graph in its order (a tensor is
    alive from its producer, or the start for an input, to its last consumer, or the end for an output)."""
    nodes = list(model.graph.node)
    last: dict[str, int] = {}
    for i, node in enumerate(nodes):
        for name in _used_names(node):
            last[name] = i
    for out in model.graph.output:
        last[out.name] = len(nodes)
    alive = {i.name: sizes.get(i.name, 0) for i in model.graph.input}
    total = peak = sum(alive.values())
    for i, node in enumerate(nodes):
        for o in node.output:
            if o and o not in alive:
                alive[o] = sizes.get(o, 0)
                total += alive[o]
        peak = max(peak, total)
        for name in [n for n in alive if last.get(n, -1) <= i]:
            total -= alive.pop(name)
    return peak


def _cuts(
    nodes: Sequence[onnx.NodeProto], exposed: set[str], sizes: Mapping[str, int] | None, budget: int,
    joined: frozenset[str],
) -> list[int]:
    """Where pieces start, and the end (never where a value of ``joined`` would cross)."""
    uncut = _spans(nodes, joined)
    most = NODES_PER_PIECE if sizes is None else MAX_NODES
    bounds, held = [0], 0
    for i, node in enumerate(nodes):
        size = sum(sizes.get(o, 0) for o in node.output if o in exposed) if sizes is not None else 0
        full = i - bounds[-1] >= most or (sizes is not None and held + size > budget)
        if i > bounds[-1] and i not in uncut and full:
            bounds.append(i)
            held = 0
        held += size
    return bounds + [len(nodes)]


def _spans(nodes: Sequence[onnx.NodeProto], joined: frozenset[str]) -> set[int]:
    """The node positions a piece must not start at: after the producer of a value of ``joined`` and up
    to its last user."""
    produced: dict[str, int] = {}
    inside: set[int] = set()
    for i, node in enumerate(nodes):
        for name in _used_names(node) & joined:
            if name in produced:
                inside.update(range(produced[name] + 1, i + 1))
        produced.update({o: i for o in node.output if o in joined})
    return inside


def chain_pieces(
    model: onnx.ModelProto, exposed: Sequence[str], sizes: Mapping[str, int] | None = None, budget: int = 0,
    joined: Collection[str] = (), shapes: Mapping[str, onnx.TypeProto] | None = None,
) -> Iterator[onnx.ModelProto]:
    """The pieces of ``model`` (see module doc), built one at a time; ``exposed``: the names every
    piece must give out when it computes them; ``sizes``, ``budget``: how pieces are cut, by size;
    ``joined``: values that must not cross between pieces; ``shapes``: the tensors' types with the
    shapes that hold for every input size (the model inferred at its own inputs' dims, not a sample's),
    which a piece's inputs declare: a piece's inputs declared without a shape lose what onnxruntime's
    inference needs of a value computed elsewhere (a Resize whose ``scales`` is an empty tensor and
    ``sizes`` four values, both computed: without their shapes, onnxruntime refused the piece of YOLOS's
    patch-embedding interpolation that the whole model loads with)."""
    graph = model.graph
    nodes = list(graph.node)
    inputs = {i.name for i in graph.input}
    initializers = {t.name: t for t in graph.initializer}
    bounds = _cuts(nodes, set(exposed), sizes, budget, frozenset(joined))
    computed = {o for node in nodes for o in node.output}
    if (len(bounds) <= 2 or inputs & set(initializers) or len(graph.sparse_initializer)
            or any(o.name not in computed for o in graph.output)):
        yield model
        return
    types = {v.name: v.type for v in (*graph.input, *graph.value_info, *graph.output)}
    uses = [_used_names(n) for n in nodes]
    produced_in = {}
    for p, (lo, hi) in enumerate(zip(bounds, bounds[1:], strict=False)):
        for node in nodes[lo:hi]:
            produced_in.update({o: p for o in node.output if o})
    used_after: list[set[str]] = []  # per piece: names used by later pieces (or graph outputs)
    later = {o.name for o in graph.output}
    for lo, hi in reversed(list(zip(bounds, bounds[1:], strict=False))):
        used_after.append(set(later))
        for u in uses[lo:hi]:
            later |= u
    used_after.reverse()
    crossing = {n for p, after in enumerate(used_after) for n in after if produced_in.get(n, -1) == p}
    if any(n not in types or not types[n].HasField("tensor_type") for n in crossing):
        yield model
        return
    wanted = set(exposed)
    for p, (lo, hi) in enumerate(zip(bounds, bounds[1:], strict=False)):
        own = [o for node in nodes[lo:hi] for o in node.output if o]
        own_set = set(own)
        needed = sorted(set().union(*uses[lo:hi]) - own_set, key=lambda n: (produced_in.get(n, -1), n))
        feeds = [n for n in needed if n not in initializers and n in types]
        outputs = [o for o in own if o in wanted] + [o for o in own if o in used_after[p] and o not in wanted]
        piece = oh.make_graph(
            nodes[lo:hi], f"{graph.name}_piece{p}",
            [_value(n, types[n], (shapes or {}).get(n)) for n in feeds],
            [_value(n, types[n]) if n in types else onnx.ValueInfoProto(name=n) for n in outputs],
            [initializers[n] for n in needed if n in initializers],
        )
        out = oh.make_model(piece, opset_imports=model.opset_import, ir_version=model.ir_version)
        out.functions.extend(model.functions)
        yield out


def _value(name: str, type_proto: onnx.TypeProto, shaped: onnx.TypeProto | None = None) -> onnx.ValueInfoProto:
    """A value of ``type_proto``'s element type, with ``shaped``'s shape where it is a tensor of that
    type, else no shape (``type_proto``'s are a sample's sizes: other samples may differ)."""
    if type_proto.HasField("tensor_type"):
        elem = type_proto.tensor_type.elem_type
        if (shaped is not None and shaped.HasField("tensor_type") and shaped.tensor_type.elem_type == elem
                and shaped.tensor_type.HasField("shape")):
            value = onnx.ValueInfoProto(name=name)
            value.type.CopyFrom(shaped)
            return value
        return oh.make_tensor_value_info(name, elem, None)
    value = onnx.ValueInfoProto(name=name)
    value.type.CopyFrom(type_proto)
    return value


def _used_names(node: onnx.NodeProto) -> set[str]:
    """The names ``node`` reads: its inputs and what its subgraphs take from outer scopes."""
    used = {i for i in node.input if i}
    for attr in node.attribute:
        for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
            used |= _outer_names(sub)
    return used


def _outer_names(graph: onnx.GraphProto) -> set[str]:
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    used: set[str] = set()
    for node in graph.node:
        used |= _used_names(node) - defined
        defined |= set(node.output)
    return used
