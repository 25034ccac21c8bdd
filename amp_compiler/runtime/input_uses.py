"""What a graph does with an input's values, read from the graph alone (no data): the ops that read them,
through casts, reshapes and selections (:func:`reached`), the token tables they index (:func:`vocabulary`), the
dims of other inputs they index (:func:`index_size`, :data:`INDEX_INPUTS`), whether they are added to a softmax's
logits (:func:`added_to_logits`: an additive attention mask) or reach one at all (:func:`reaches_softmax_anyhow`:
a bool mask), whether an op needing positive values reads them (:func:`positive_reader`: ``log(sigma)``), and the
maps these walks read (:func:`graph_uses`: readers, producers, constants, declared shapes, subgraphs included).
:mod:`amp_compiler.runtime.input_kinds` decides from them what values a generated input takes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping

import numpy as np
import onnx
import onnx.numpy_helper

__all__ = [
    "INDEX_INPUTS", "VALUES_KEPT", "GraphUses", "IndexInput", "added_to_logits", "constant_nodes", "graph_uses",
    "index_size", "integer_views", "notable_ids", "positive_reader", "reached", "reaches_softmax_anyhow", "vocabulary",
]

#: Ops whose output holds their input 0's values, or some of them: casts and reshapes, and selections. An index
#: input passes through them on its way to an embedding Gather or another op it indexes with (DLRM's sparse ids,
#: ``[batch, tables]``, reach each table through a Gather on axis 1 of the input); a Sigmoid's probabilities on
#: their way to a graph output (:func:`~amp_compiler.onnx.measure.output_error.logistic_outputs`).
VALUES_KEPT = frozenset({
    "Cast", "Unsqueeze", "Squeeze", "Reshape", "Identity", "Flatten", "Gather", "Slice", "Split", "Transpose", "Expand",
})


@dataclasses.dataclass(frozen=True)
class IndexInput:
    """An op's integer input whose values index a dim of another of its inputs: its ``position``, the
    input it indexes (``data``), which of that input's dims (``dims``: ``axis``, the op's axis attribute,
    default 0; ``first``, dim 0; ``leading``, those from ``batch_dims`` on, GatherND's index tuples; ``value``,
    no dim but ``data``'s value, OneHot's depth), and why an index out of range matters."""

    position: int
    data: int
    dims: str
    reason: str


#: Integer inputs that index a dim of another input: a generated one is drawn below that dim's size, or is 0
#: where the size is not known (0 is valid for any non-empty dim; the generic 1 is not for a batch of 1:
#: onnxruntime refused every probe run of a RoiAlign taking its ``batch_indices`` as a graph input). A
#: count (TopK's k) is no index. Here, not in ``policy/onnx_ops.toml``: ``runtime/`` sits below ``policy/``.
INDEX_INPUTS: dict[str, IndexInput] = {
    "Gather": IndexInput(1, 0, "axis", "onnxruntime refuses an index outside [-n, n) of data's axis"),
    "GatherElements": IndexInput(1, 0, "axis", "onnxruntime refuses an index outside [-n, n) of data's axis"),
    "ScatterElements": IndexInput(1, 0, "axis", "onnxruntime refuses an index outside [-n, n) of data's axis"),
    "Scatter": IndexInput(1, 0, "axis", "ScatterElements before opset 11: the same indices"),
    "GatherND": IndexInput(1, 0, "leading", "each index tuple addresses data's dims from batch_dims on"),
    "ScatterND": IndexInput(1, 0, "leading", "each index tuple addresses data's leading dims"),
    "RoiAlign": IndexInput(2, 0, "first", "batch_indices: the image of X's batch each box is in; checked in range"),
    "OneHot": IndexInput(0, 1, "value", "an index outside depth gives a row of zeros, no one-hot row"),
}


@dataclasses.dataclass
class GraphUses:
    """The maps the walks read, over the main graph and its subgraphs: each value's readers, each value's
    producer, the constants (initializers and Constant nodes) and the declared shapes (None: a dim not fixed)."""

    consumers: dict[str, list[onnx.NodeProto]]
    inits: dict[str, onnx.TensorProto]
    producers: dict[str, onnx.NodeProto]
    shapes: dict[str, list[int | None]]


def graph_uses(model: onnx.ModelProto) -> GraphUses:
    """:class:`GraphUses` of ``model``: a merged decoder looks its tokens up inside an If, so subgraphs count."""
    uses = GraphUses({}, {}, {}, {})
    for graph in _graphs(model.graph):
        uses.shapes.update((v.name, _static_dims(v)) for v in [*graph.input, *graph.value_info, *graph.output]
                           if v.type.HasField("tensor_type") and v.type.tensor_type.HasField("shape"))
        for node in graph.node:
            for name in node.input:
                uses.consumers.setdefault(name, []).append(node)
            uses.producers.update((out, node) for out in node.output)
        uses.inits.update((i.name, i) for i in graph.initializer)
        uses.inits.update(constant_nodes(graph))  # torch.onnx writes `x / 255` with a Constant node
    return uses


#: A Constant node's attributes that hold its value as numbers, with their element types (``value`` holds a
#: tensor already; ``sparse_value`` and the strings hold no pixel scale or table).
_CONSTANT_NUMBERS = {
    "value_float": onnx.TensorProto.FLOAT, "value_floats": onnx.TensorProto.FLOAT,
    "value_int": onnx.TensorProto.INT64, "value_ints": onnx.TensorProto.INT64,
}


def constant_nodes(graph: onnx.GraphProto) -> Iterator[tuple[str, onnx.TensorProto]]:
    """(output name, value) of ``graph``'s Constant nodes whose value is a tensor or numbers: what
    initializers are to a model saved by torch.onnx, which writes its literals (a ``/ 255``) as Constant
    nodes."""
    for node in graph.node:
        if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or not node.output:
            continue
        for attr in node.attribute:
            if attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR:
                yield node.output[0], attr.t
            elif attr.name in _CONSTANT_NUMBERS:
                value = onnx.helper.get_attribute_value(attr)
                values = value if isinstance(value, list) else [value]
                dims = [len(values)] if isinstance(value, list) else []
                yield node.output[0], onnx.helper.make_tensor("", _CONSTANT_NUMBERS[attr.name], dims, values)


def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``graph`` and its subgraphs (If branches, Loop and Scan bodies), parents first."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs):
                yield from _graphs(sub)


def vocabulary(
    name: str, consumers: Mapping[str, list[onnx.NodeProto]], inits: Mapping[str, onnx.TensorProto],
    producers: Mapping[str, onnx.NodeProto] | None = None,
) -> int:
    """The smallest first dim of the tables ``name`` indexes (0: none): through Gathers on an initializer
    (or on one dequantized or cast: a QDQ model's table), or as onnxruntime's EmbedLayerNormalization's
    word or segment ids (its tables, inputs 2 and 4)."""
    producers = producers or {}
    sizes = [rows for table in _indexed_tables(name, consumers) if (rows := _rows(table, producers, inits))]
    return min(sizes, default=0)


def _indexed_tables(name: str, consumers: Mapping[str, list[onnx.NodeProto]]) -> Iterator[str]:
    """The tables ``name``'s values index as token ids (:func:`reached`): the data of a Gather along axis 0, an
    EmbedLayerNormalization's word or segment table."""
    for node, position in reached(name, consumers):
        if node.op_type == "Gather" and position == 1 and _attribute(node, "axis", 0) == 0:
            yield node.input[0]
        elif node.op_type == "EmbedLayerNormalization" and position in _EMBEDDING_TABLES:
            if len(node.input) > _EMBEDDING_TABLES[position] and node.input[_EMBEDDING_TABLES[position]]:
                yield node.input[_EMBEDDING_TABLES[position]]


def notable_ids(
    name: str, consumers: Mapping[str, list[onnx.NodeProto]], inits: Mapping[str, onnx.TensorProto], lowest: int,
    largest: int,
) -> list[int]:
    """Token ids a probe of the ids input ``name`` always takes: the ``lowest`` first ids (the special and
    control tokens of SentencePiece, WordPiece and T5 vocabularies: pad, unk, bos, eos) and, per float
    table it indexes (:func:`_indexed_tables`: an initializer, its values in the file), the ``largest``
    rows of the largest L2 norms (the tokens training made stand out), in that order, each once, all below
    the smallest table's rows (:func:`vocabulary`)."""
    rows = vocabulary(name, consumers, inits)
    ids = list(range(min(lowest, rows)))
    for table in (inits.get(t) for t in _indexed_tables(name, consumers)):
        if (table is None or len(table.dims) != 2 or table.data_location == onnx.TensorProto.EXTERNAL
                or table.data_type not in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)):
            continue
        norms = _row_norms(table)
        ids += [int(i) for i in np.argsort(-norms, kind="stable")[:largest] if i < rows]
    return list(dict.fromkeys(ids))


#: Rows of a table whose squared norms :func:`_row_norms` sums at once (a few MB of float64 at a time).
_NORM_ROWS = 4096


def _row_norms(table: onnx.TensorProto) -> np.ndarray:
    """The squared L2 norm of each row of the 2-D float initializer ``table``, in float64, a block of rows at
    a time, read in place from its raw bytes where it has them (a 1 GB embedding is not copied)."""
    dtype = onnx.helper.tensor_dtype_to_np_dtype(table.data_type)
    rows, width = (int(d) for d in table.dims)
    if table.HasField("raw_data"):
        values = np.frombuffer(table.raw_data, dtype=dtype.newbyteorder("<"), count=rows * width).reshape(rows, width)
    else:
        values = onnx.numpy_helper.to_array(table)
    norms = np.empty(rows, np.float64)
    for start in range(0, rows, _NORM_ROWS):
        block = values[start:start + _NORM_ROWS].astype(np.float64)
        norms[start:start + _NORM_ROWS] = np.einsum("ij,ij->i", block, block)
    return norms


def reached(name: str, consumers: Mapping[str, list[onnx.NodeProto]]) -> Iterator[tuple[onnx.NodeProto, int]]:
    """(node, input position) of every use of ``name``'s values: its own uses, and those of what it passes
    through (:data:`VALUES_KEPT`, as their input 0)."""
    stack, seen = [name], {name}
    while stack:
        value = stack.pop()
        for node in consumers.get(value, ()):
            for position in (k for k, used in enumerate(node.input) if used == value):
                yield node, position
            if node.op_type in VALUES_KEPT and node.input and node.input[0] == value:
                for out in node.output:
                    if out not in seen:
                        seen.add(out)
                        stack.append(out)


#: Ops a float input's values pass through, as their input 0, on their way to a Cast to an integer type, keeping
#: an integral value what it is: reshapes and selections (:data:`VALUES_KEPT` but Cast) and roundings (Floor, Ceil,
#: Round: a bucketed coordinate). A Cast to another float type is not on it: that input stays a float.
_TO_INTEGER_PATH = frozenset({*VALUES_KEPT - {"Cast"}, "Floor", "Ceil", "Round"})


def integer_views(name: str, consumers: Mapping[str, list[onnx.NodeProto]]) -> list[str]:
    """The values that hold a float ``name``'s values converted to integers: the outputs of the Casts to an
    integer type it reaches through :data:`_TO_INTEGER_PATH` (magika's ``bytes``, floats 0..256, cast to int64
    for a OneHot of depth 257). What they index (:func:`vocabulary`, :func:`index_size`) bounds its values as it
    would an integer input's."""
    views: list[str] = []
    stack, seen = [name], {name}
    while stack:
        value = stack.pop()
        for node in consumers.get(value, ()):
            if not node.input or node.input[0] != value or node.domain not in ("", "ai.onnx"):
                continue
            if node.op_type == "Cast":
                to = next((a.i for a in node.attribute if a.name == "to"), 0)
                if to and np.issubdtype(onnx.helper.tensor_dtype_to_np_dtype(to), np.integer):
                    views.extend(node.output)
            elif node.op_type in _TO_INTEGER_PATH:
                fresh = [out for out in node.output if out not in seen]
                seen.update(fresh)
                stack.extend(fresh)
    return views


def index_size(
    name: str, consumers: Mapping[str, list[onnx.NodeProto]], inits: Mapping[str, onnx.TensorProto],
    producers: Mapping[str, onnx.NodeProto], shapes: Mapping[str, list[int | None]],
) -> tuple[int, str] | None:
    """The smallest size of the dims ``name`` indexes (:data:`INDEX_INPUTS`; 1 where one is not known: only
    0 is drawn) and the op input that indexes it (``RoiAlign batch_indices``); None when it indexes none."""
    found: list[tuple[int, str]] = []
    for node, position in reached(name, consumers):
        entry = INDEX_INPUTS.get(node.op_type)
        if entry is None or node.domain not in ("", "ai.onnx") or entry.position != position:
            continue
        data = node.input[entry.data] if len(node.input) > entry.data else ""
        found.append((max(_indexed(node, entry, data, inits, producers, shapes) or 1, 1),
                      f"{node.op_type} {_formal(node.op_type, position)}"))
    return min(found) if found else None


def _indexed(
    node: onnx.NodeProto, entry: IndexInput, data: str, inits: Mapping[str, onnx.TensorProto],
    producers: Mapping[str, onnx.NodeProto], shapes: Mapping[str, list[int | None]],
) -> int | None:
    """The size of the dims ``node``'s index input addresses in ``data`` (the smallest of several), as far as
    the graph states it (None: not known)."""
    if entry.dims == "value":
        value = inits.get(data)
        array = onnx.numpy_helper.to_array(value) if value is not None and math.prod(value.dims) == 1 else None
        return int(array.ravel()[0]) if array is not None and np.issubdtype(array.dtype, np.number) else None
    dims = _dims(data, producers, inits, shapes)
    if not dims:
        return None
    if entry.dims == "leading":
        leading = dims[_attribute(node, "batch_dims", 0):]
        return min(leading) if leading and None not in leading else None  # type: ignore[type-var]
    axis = _attribute(node, "axis", 0) if entry.dims == "axis" else 0
    return dims[axis] if -len(dims) <= axis < len(dims) else None


def _attribute(node: onnx.NodeProto, name: str, default: int) -> int:
    return next((int(a.i) for a in node.attribute if a.name == name), default)


def _formal(op_type: str, position: int) -> str:
    """The name onnx's schema gives an op's input (``batch_indices``), else ``input N``."""
    try:
        return onnx.defs.get_schema(op_type).inputs[position].name
    except (onnx.defs.SchemaError, IndexError):
        return f"input {position}"


def _static_dims(info: onnx.ValueInfoProto) -> list[int | None]:
    """A value's dims, None where not a fixed size."""
    return [int(d.dim_value) if d.HasField("dim_value") else None for d in info.type.tensor_type.shape.dim]


#: EmbedLayerNormalization's index inputs (word ids 0, segment ids 1) and the tables they index.
_EMBEDDING_TABLES = {0: 2, 1: 4}
#: Ops a table passes through unchanged in its rows: a QDQ model's dequantized table, a cast one.
_TABLE_PATH = frozenset({"DequantizeLinear", "Cast", "Identity"})


def _rows(name: str, producers: Mapping[str, onnx.NodeProto], inits: Mapping[str, onnx.TensorProto]) -> int:
    """The first dim of the initializer ``name`` is, or is made from through :data:`_TABLE_PATH` (0: none)."""
    dims = _dims(name, producers, inits, {})
    return (dims[0] or 0) if dims else 0


def _dims(
    name: str, producers: Mapping[str, onnx.NodeProto], inits: Mapping[str, onnx.TensorProto],
    shapes: Mapping[str, list[int | None]],
) -> list[int | None] | None:
    """The dims of the constant ``name`` is, or is made from through :data:`_TABLE_PATH`, else those its
    declared shape fixes (``shapes``; None: not known)."""
    for _ in range(4):
        table = inits.get(name)
        if table is not None:
            return [int(d) for d in table.dims]
        if name in shapes:
            return list(shapes[name])
        node = producers.get(name)
        if node is None or node.op_type not in _TABLE_PATH or not node.input:
            return None
        name = node.input[0]
    return None


#: Ops a mask passes through, as their input 0, on its way to the scores it is added to: casts, reshapes,
#: broadcasting and selections (HF's 4-D ``[batch, 1, query, key]`` mask sliced to the sequence, expanded to heads).
_MASK_PATH = frozenset({"Cast", "Identity", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Expand", "Tile", "Slice",
                        "Transpose"})
#: Ops between the Add of a mask and the Softmax that reads the logits: more biases, scales, a clamp
#: (``max(scores, finfo.min)``), a ``masked_fill`` (Where), reshapes and casts.
_LOGIT_PATH = frozenset({"Add", "Sub", "Mul", "Div", "Max", "Min", "Clip", "Where", *_MASK_PATH})
_SOFTMAX = frozenset({"Softmax", "LogSoftmax"})
#: Ops whose input 0 must be positive (Log, Sqrt: NaN below 0; Reciprocal: infinite at 0; Pow: NaN for a
#: negative base and a fractional exponent, :func:`_fractional`).
_POSITIVE_DOMAIN = frozenset({"Log", "Sqrt", "Reciprocal", "Pow"})
#: How many ops deep a walk from an input looks (a mask reaches its Softmax within a few: PyTorch's key padding
#: mask through 7, Cast, Where, Reshape, Expand, Reshape, Reshape, Add).
_REACH = 12


def _constant(name: str, uses: GraphUses) -> np.ndarray | None:
    """The value of a constant of at most 64 elements (an initializer, a Constant node), else None."""
    init = uses.inits.get(name)
    if init is None or math.prod(init.dims) > 64:
        return None
    array = onnx.numpy_helper.to_array(init)
    return array if np.issubdtype(array.dtype, np.number) else None


def _scaled(node: onnx.NodeProto, value: str, uses: GraphUses, positive: bool = False) -> bool:
    """``node`` scales ``value`` by a constant (Mul by one, Div of ``value`` by one; ``positive``: a constant
    above 0, so the sign stays)."""
    if node.op_type not in ("Mul", "Div") or len(node.input) != 2 or (node.op_type == "Div" and node.input[0] != value):
        return False
    other = _constant(node.input[1] if node.input[0] == value else node.input[0], uses)
    return other is not None and (not positive or bool(np.all(other > 0)))


def _along(
    name: str, uses: GraphUses, step: Callable[[onnx.NodeProto, str], bool]
) -> Iterator[tuple[onnx.NodeProto, str]]:
    """(reader, the value it reads) of every op ``name``'s values reach while ``step(node, value)`` says the
    op passes them on (to all its outputs), breadth first, :data:`_REACH` ops deep at most."""
    frontier, seen = [(name, 0)], {name}
    while frontier:
        value, depth = frontier.pop(0)
        for node in uses.consumers.get(value, ()):
            yield node, value
            if depth < _REACH and step(node, value):
                for out in node.output:
                    if out not in seen:
                        seen.add(out)
                        frontier.append((out, depth + 1))


def _computed(name: str, uses: GraphUses) -> bool:
    """``name`` is the output of an op that is no Constant (not a constant, not a graph input)."""
    node = uses.producers.get(name)
    return node is not None and node.op_type != "Constant" and name not in uses.inits


def _reaches_softmax(name: str, uses: GraphUses) -> bool:
    """Whether ``name`` reaches a Softmax's or LogSoftmax's input through :data:`_LOGIT_PATH`."""
    return any(node.op_type in _SOFTMAX and node.input[0] == value
               for node, value in _along(name, uses, lambda node, value: node.op_type in _LOGIT_PATH))


def added_to_logits(name: str, uses: GraphUses) -> bool:
    """Whether ``name`` is an additive attention mask (or bias): through :data:`_MASK_PATH` (as input 0) and
    scalings by constants, it is added (Add) to a value an op computes (the scores: no constant, no graph input),
    and the sum reaches a Softmax's logits (:func:`_reaches_softmax`). A 0/1 mask turned into a bias in the graph
    (``(1 - m) * -10000``: a Sub) or multiplied with the scores is not: it never meets the Add as it is."""
    def step(node: onnx.NodeProto, value: str) -> bool:
        return (node.op_type in _MASK_PATH and node.input[0] == value) or _scaled(node, value, uses)
    return any(node.op_type == "Add" and len(node.input) == 2
               and _computed(node.input[1] if node.input[0] == value else node.input[0], uses)
               and _reaches_softmax(node.output[0], uses)
               for node, value in _along(name, uses, step))


def positive_reader(name: str, uses: GraphUses) -> str | None:
    """The op (:data:`_POSITIVE_DOMAIN`) that takes ``name``'s values as its input 0 through casts, reshapes
    (:data:`_MASK_PATH`), scalings by positive constants and Adds of a constant (``log(x + eps)``), and so
    needs them positive: ``log(sigma)`` (EDM's noise conditioning), ``sqrt(variance)``; None when none does.
    A square on the way (``sqrt(sigma ** 2 + 0.25)``) takes any sign: its Pow is no linear step."""
    def step(node: onnx.NodeProto, value: str) -> bool:
        if node.op_type in _MASK_PATH:
            return node.input[0] == value
        if node.op_type == "Add" and len(node.input) == 2:
            return _constant(node.input[1] if node.input[0] == value else node.input[0], uses) is not None
        return _scaled(node, value, uses, positive=True)
    for node, value in _along(name, uses, step):
        if node.op_type in _POSITIVE_DOMAIN and node.input[0] == value and (
                node.op_type != "Pow" or _fractional(node, uses)):
            return node.op_type
    return None


def _fractional(node: onnx.NodeProto, uses: GraphUses) -> bool:
    """A Pow whose exponent is a constant with a fractional value (``x ** 0.5``): NaN for a negative base."""
    exponent = _constant(node.input[1], uses) if len(node.input) > 1 else None
    return exponent is not None and bool(np.any(exponent != np.round(exponent)))


def reaches_softmax_anyhow(name: str, uses: GraphUses) -> bool:
    """Whether ``name`` reaches a Softmax or LogSoftmax through any ops at all (a bool key padding mask: a
    Where or a Cast makes it a bias, then an Add, a reshape), :data:`_REACH` values at most."""
    return any(node.op_type in _SOFTMAX for node, _ in _along(name, uses, lambda node, value: node.op_type != "If"))
