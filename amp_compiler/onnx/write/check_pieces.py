"""The converted model cut into overlapping pieces for the load check, each distinct piece once.

onnxruntime's session creation is far from linear in the node count on FP16 graphs: its CPU provider
inserts a Cast around every FP16 node it has no FP16 kernel for, and names each one by scanning
every node of the graph (``Graph::GenerateNodeName``), so a 10,000-node FP16 graph takes seconds
and a 100,000-node one minutes. The load check (:mod:`amp_compiler.onnx.write.load_check`) therefore loads a
large output in pieces:

- The nodes, in the model's order (topological), are cut into runs of ``SPAN`` to ``4 * SPAN``
  nodes. The cuts fall where the local structure repeats (the positions whose last few nodes have
  the smallest structural hash), so that the repeated layers of a model give identical pieces.
- Each piece also holds the ``OVERLAP`` nodes before its run: every stretch of ``OVERLAP + 1``
  consecutive nodes lies wholly inside one piece. onnxruntime's fusions match a few connected
  nodes, which exporters write next to each other, so each fusion and each Cast it inserts is seen
  by some piece as it is in the whole model.
- A tensor a piece reads but does not make is a graph input of the piece (typed and shaped as the
  conversion inferred it); a tensor it makes that a later node or the graph's output reads is a graph
  output; initializers and the model's functions, opsets and IR version come along.
- Pieces with the same structure are loaded once: the same ops, attributes and wiring, the same
  types and shapes at their borders, the same values in their small and non-float initializers
  (the values onnxruntime's optimizers read: shapes, axes, scalars); float weights of more than one
  element count by type and shape only (their values change no graph transformation).
- For the same reason a piece's large float weights (``STAND_IN_MIN_BYTES`` or more) are stand-ins:
  external data of the right size, zeros read from one sparse file (:func:`write_stand_in`). The
  pieces are therefore made from the output's graph alone, before its weights are converted or
  written, and none of them copies or reads a weight.

What that gives up: a fusion spanning more than ``OVERLAP + 1`` consecutive nodes, or a failure that
needs the whole graph, is not seen. A piece never fails where the whole model loads: the caller
confirms a piece's failure on the whole model before refusing it.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import onnx
import onnx_ir as ir

from amp_compiler.core.gc_pause import gc_paused
from amp_compiler.onnx.load.files import DEFER_MIN_BYTES
from amp_compiler.onnx.load.proto_walk import subgraphs

__all__ = [
    "OVERLAP", "SPAN", "STAND_IN_FILE", "STAND_IN_MIN_BYTES", "TypeTable", "load_pieces", "stands_in",
    "value_types", "write_stand_in",
]

#: Nodes per piece (at least), and the nodes each piece repeats before its own run.
SPAN = 32
OVERLAP = 48
#: Longer than any piece (a run and its overlap): a tensor read this far from where it is made is a
#: border of every piece.
_FAR = 5 * SPAN + OVERLAP + 1  # the last run may have up to SPAN // 2 nodes more
#: Nodes whose structure the cut positions are chosen by.
_WINDOW = 4
#: A piece whose weights would pass protobuf's 2 GiB limit is not made (the whole model is loaded).
_MAX_PIECE_BYTES = 1 << 30
#: Float weights of this many bytes or more are stand-ins in the pieces (the size of the weights a
#: conversion leaves on disk), read from this file in the pieces' data folder.
STAND_IN_MIN_BYTES = DEFER_MIN_BYTES
STAND_IN_FILE = "stand-in-weights.bin"

#: name -> (type, shape) of every tensor of the main graph, as the conversion inferred them.
TypeTable = Mapping[str, "tuple[ir.TypeProtocol | None, ir.Shape | None]"]

_GRAPH_ATTRIBUTES = frozenset({onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS})
_FLOATS = frozenset({
    onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE,
    onnx.TensorProto.FLOAT8E4M3FN, onnx.TensorProto.FLOAT8E4M3FNUZ, onnx.TensorProto.FLOAT8E5M2,
    onnx.TensorProto.FLOAT8E5M2FNUZ,
})


def value_types(model: ir.Model) -> dict[str, tuple[ir.TypeProtocol | None, ir.Shape | None]]:
    """The :data:`TypeTable` of ``model``'s main graph (taken before the output drops inferred types)."""
    graph = model.graph
    table = {v.name: (v.type, v.shape) for v in graph.inputs if v.name}
    for node in graph:
        for v in node.outputs:
            if v.name:
                table[v.name] = (v.type, v.shape)
    return table


@gc_paused
def load_pieces(model: onnx.ModelProto, types: TypeTable) -> list[onnx.ModelProto] | None:
    """The distinct pieces of ``model`` to load instead of the whole (see the module doc), their
    large weights stand-ins (load them with :func:`write_stand_in`'s file in their data folder), or
    None when the whole model should be loaded: it has at most ``SPAN + OVERLAP`` nodes, a tensor at
    a border has no known type, or a piece would need an initializer that is neither in ``model``
    nor a stand-in (other external data). ``model``'s large float weights may be placeholders (a
    type and shape, no data): their values are never read."""
    nodes = model.graph.node
    if len(nodes) <= SPAN + OVERLAP:
        return None
    wiring = _Wiring(model)
    pieces: list[onnx.ModelProto] = []
    seen: set[bytes] = set()
    for lo, hi in _ranges(wiring.signatures):
        key = wiring.key(lo, hi, types)
        if key is None:
            return None
        if key in seen:
            continue
        seen.add(key)
        piece = wiring.piece(lo, hi, types)
        if piece is None:
            return None
        pieces.append(piece)
    return pieces


def write_stand_in(pieces: Sequence[onnx.ModelProto], folder: str | os.PathLike) -> None:
    """Make the file of zeros in ``folder`` that the stand-in weights of ``pieces`` read (sparse: no
    bytes are written)."""
    size = max((
        int(entry.value) for piece in pieces for tensor in piece.graph.initializer for entry in tensor.external_data
        if entry.key == "length"
    ), default=0)
    with open(Path(folder) / STAND_IN_FILE, "wb") as f:
        f.truncate(size)


def _ranges(signatures: list[int]) -> Iterator[tuple[int, int]]:
    """(first, end) node positions of each piece: runs of ``SPAN`` to ``4 * SPAN`` nodes (the last up to
    ``SPAN // 2`` more) cut at the positions whose last few node signatures hash lowest, each run with
    the ``OVERLAP`` nodes before it."""
    n = len(signatures)
    window = [hash(tuple(signatures[max(0, i - _WINDOW + 1): i + 1])) for i in range(n)]
    wanted = max(1, n // (2 * SPAN))  # at least one candidate cut per two pieces' worth of nodes
    threshold = sorted(window)[min(n - 1, wanted - 1)]
    start = 0
    for i in range(SPAN, n - SPAN // 2):
        if (window[i - 1] <= threshold and i - start >= SPAN) or i - start >= 4 * SPAN:
            yield max(0, start - OVERLAP), i
            start = i
    yield max(0, start - OVERLAP), n


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


class _Wiring:
    """Per node of the main graph: a structural signature (op, attributes, where each input comes from
    relative to the node, how far each output is read), interned to an int."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        graph = model.graph
        self.nodes = list(graph.node)
        self.initializers = {t.name: t for t in graph.initializer}
        self.graph_inputs = {v.name: v for v in graph.input}
        self.graph_outputs = {v.name: v for v in graph.output}
        self.described = {v.name: v for v in graph.value_info}
        self.outputs: list[list[str]] = []
        self.reads: list[list[str]] = []
        self.sources: list[list[tuple]] = []  # where each input comes from (a node: how far back)
        self.heads: list[tuple] = []  # op, domain, attributes
        self.reach: list[int] = []  # how far back the node's furthest node input was made
        producer: dict[str, tuple[int, int]] = {}  # tensor -> (node position, output index)
        last_use: dict[str, int] = {}
        constants: dict[str, tuple] = {}
        for i, node in enumerate(self.nodes):  # the one pass over the protos
            names = list(node.input)
            attributes = node.attribute
            attrs = b""
            if attributes:
                if any(a.type in _GRAPH_ATTRIBUTES for a in attributes):
                    names.extend(sorted(_outer_names(node)))
                attrs = _digest(b"".join(a.SerializeToString() for a in attributes))
            sources: list[tuple] = []
            reach = 0
            for name in names:
                last_use[name] = i
                made = producer.get(name)
                if made is not None:  # made by an earlier node (the order is topological)
                    back = i - made[0]
                    reach = max(reach, back)
                    sources.append((back, made[1]))
                elif not name:
                    sources.append(())
                elif name in self.initializers:
                    if name not in constants:
                        constants[name] = _constant_signature(self.initializers[name], name in self.graph_inputs)
                    sources.append(constants[name])
                else:
                    sources.append((name,))
            outputs = list(node.output)
            for k, name in enumerate(outputs):
                producer[name] = (i, k)
            self.reads.append(names)
            self.outputs.append(outputs)
            self.sources.append(sources)
            self.heads.append((node.op_type, node.domain, attrs))
            self.reach.append(reach)
        last_use.pop("", None)
        producer.pop("", None)
        self.producer, self.last_use = producer, last_use
        interned: dict[tuple, int] = {}
        self.signatures: list[int] = []  # interned, offsets capped at _FAR: the node inside any piece
        self.sinks: list[list[tuple]] = []  # how far ahead each output is last read
        self.ahead: list[int] = []  # how far ahead its furthest output is read (_FAR: a graph output)
        outputs_of_graph, described = self.graph_outputs, self.described
        for i, outputs in enumerate(self.outputs):
            sinks = [
                (last_use.get(name, i) - i, name in outputs_of_graph,
                 described[name].type.SerializeToString() if name in described else b"")
                for name in outputs
            ]
            capped = (
                tuple((min(s[0], _FAR), s[1]) if len(s) == 2 else s for s in self.sources[i]),
                tuple((min(s[0], _FAR), *s[1:]) for s in sinks),
            )
            self.signatures.append(interned.setdefault((self.heads[i], *capped), len(interned)))
            self.sinks.append(sinks)
            self.ahead.append(max((_FAR if s[1] else s[0] for s in sinks), default=0))

    def _borders(self, lo: int, hi: int) -> tuple[list[str], list[str]]:
        """The tensors made before ``lo`` that nodes lo..hi-1 read, and those they make that a node
        from ``hi`` on or the graph's output reads."""
        inputs: dict[str, None] = {}
        for i in range(lo, hi):
            if i - self.reach[i] < lo:
                for name in self.reads[i]:
                    if name in self.producer and self.producer[name][0] < lo:
                        inputs[name] = None
        outputs: dict[str, None] = {}
        for i in range(lo, hi):
            for name in self.outputs[i]:
                if name and (self.last_use.get(name, -1) >= hi or name in self.graph_outputs):
                    outputs[name] = None
        return list(inputs), list(outputs)

    def key(self, lo: int, hi: int, types: TypeTable) -> bytes | None:
        """The structure of the piece lo..hi-1 (None when a tensor at its border has no known type):
        its nodes' signatures, a node at its border seen from inside the piece (a tensor made before
        it is its n-th input, one read after it an output, however far away)."""
        inputs, outputs = self._borders(lo, hi)
        border = []
        for name in (*inputs, *outputs):
            if name in self.graph_outputs:
                continue
            if types.get(name, (None, None))[0] is None:
                return None
            border.append(repr(types[name]))
        index = {name: k for k, name in enumerate(inputs)}
        parts: list[object] = []
        for i in range(lo, hi):
            if self.reach[i] <= i - lo and self.ahead[i] < hi - i:
                parts.append(self.signatures[i])
                continue
            sources = tuple(
                ("in", index[name]) if len(source) == 2 and source[0] > i - lo else source
                for name, source in zip(self.reads[i], self.sources[i], strict=True)
            )
            sinks = tuple(("out", *sink[1:]) if sink[0] >= hi - i else sink for sink in self.sinks[i])
            parts.append((self.heads[i], sources, sinks))
        return _digest(repr((parts, border)).encode())

    def piece(self, lo: int, hi: int, types: TypeTable) -> onnx.ModelProto | None:
        """The model of nodes lo..hi-1, its large float weights stand-ins (None when it needs other
        external data, or its weights would be too large for one ModelProto)."""
        inputs, outputs = self._borders(lo, hi)
        graph = onnx.GraphProto(name=self.model.graph.name)
        graph.node.extend(self.nodes[lo:hi])
        made = {name for outputs in self.outputs[lo:hi] for name in outputs if name}
        used = [name for i in range(lo, hi) for name in self.reads[i] if name and name not in made]
        size = 0
        for name in dict.fromkeys(used):
            if name in self.initializers:
                original = self.initializers[name]
                tensor = graph.initializer.add()
                stand_in = _stand_in_bytes(original)
                if stand_in:
                    tensor.name, tensor.data_type = original.name, original.data_type
                    tensor.dims.extend(original.dims)
                    tensor.data_location = onnx.TensorProto.EXTERNAL
                    for key, value in (("location", STAND_IN_FILE), ("offset", "0"), ("length", str(stand_in))):
                        tensor.external_data.add(key=key, value=value)
                elif original.data_location == onnx.TensorProto.EXTERNAL:
                    return None
                else:
                    tensor.CopyFrom(original)
                size += tensor.ByteSize()
                if size > _MAX_PIECE_BYTES:
                    return None
            if name in self.graph_inputs:
                graph.input.append(self.graph_inputs[name])
        for name in inputs:
            graph.input.append(_value_info(name, types))
        for name in outputs:
            graph.output.append(self.graph_outputs.get(name) or _value_info(name, types))
        graph.value_info.extend(self.described[n] for n in made if n in self.described and n not in outputs)
        out = onnx.ModelProto(ir_version=self.model.ir_version, producer_name="amp-compiler load check")
        out.opset_import.extend(self.model.opset_import)
        out.functions.extend(self.model.functions)
        out.graph.CopyFrom(graph)
        return out


def _elements(tensor: onnx.TensorProto) -> int:
    elements = 1
    for d in tensor.dims:
        elements *= d
    return elements


def _constant_signature(tensor: onnx.TensorProto, is_input: bool) -> tuple:
    """What of an initializer can change a graph transformation: its type and shape, and its values
    unless it is a float tensor of more than one element (a weight)."""
    weight = tensor.data_type in _FLOATS and _elements(tensor) > 1
    values = b"" if weight else _digest(tensor.SerializeToString())
    return (tensor.data_type, tuple(tensor.dims), values, is_input)


def stands_in(data_type: int, nbytes: int) -> bool:
    """Whether a tensor of this ONNX element type and size is a stand-in in the pieces: a float
    weight of ``STAND_IN_MIN_BYTES`` or more."""
    return data_type in _FLOATS and nbytes >= STAND_IN_MIN_BYTES


def _stand_in_bytes(tensor: onnx.TensorProto) -> int:
    """The bytes of ``tensor``'s stand-in, or 0 when it keeps its own data (:func:`stands_in`)."""
    if tensor.data_type not in _FLOATS:
        return 0
    size = _elements(tensor) * onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    return size if stands_in(tensor.data_type, size) else 0


def _outer_names(node: onnx.NodeProto) -> set[str]:
    """The tensors of enclosing graphs that ``node``'s subgraphs read."""
    used: set[str] = set()
    for graph in subgraphs(node):
        defined = {v.name for v in graph.input} | {t.name for t in graph.initializer}
        defined |= {t.values.name for t in graph.sparse_initializer}
        defined |= {name for n in graph.node for name in n.output}
        for n in graph.node:
            used.update(name for name in n.input if name and name not in defined)
            if any(True for _ in subgraphs(n)):
                used.update(_outer_names(n) - defined)
    return used


def _value_info(name: str, types: TypeTable) -> onnx.ValueInfoProto:
    type_, shape = types[name]
    return ir.serde.serialize_value(ir.Value(name=name, type=type_, shape=shape))
