"""The sizes the range probe gives a model's dynamic dims so that generated inputs run it as real ones do.

The generic dims search (:mod:`~amp_compiler.onnx.measure.generated_inputs`) takes the smallest sizes a
model runs with: 1 where it can. A transformer then sees a sequence of one token: no attention over
other tokens (its softmax is one wide and always 1), one position embedding. A voice detector's
waveform of 1 sample runs nothing at all. So, before the search, the probe gives these dims what the
graph says a real input has:

- a **token sequence** (the second dim of an integer ``[batch, sequence]`` input: token ids, masks,
  position ids; a dim named like a sequence or length elsewhere) takes the model's position table's
  size (:func:`position_table_size`) up to :data:`MAX_SEQUENCE`, else :data:`DEFAULT_SEQUENCE`;
- a **KV cache**: a dim named like ``past`` takes 0 and one named like ``total`` the sequence's length
  (the prompt step: the model computes every key itself, none is random); the head size, where the
  cache states it as a dim (onnxruntime GenAI's ``kv_cache_dim``), what its GroupQueryAttention's
  projection says (:func:`head_sizes`);
- a **waveform** (:func:`~amp_compiler.runtime.input_kinds.waveform_inputs`: a float ``[batch, samples]``,
  ``[batch, channels, samples]`` (one channel) or ``[samples]`` input in a model with a sample-rate
  input, or named like audio) takes one second
  at 16 kHz, then, if the model refuses it, a streaming chunk of 512 samples (32 ms: what Silero VAD
  and other streaming detectors take, one frame of their recurrent state at a time);
- a batch keeps 1 (:func:`~amp_compiler.onnx.measure.generated_inputs.batch_dims`);
- **every other dynamic dim** (named but not recognised above, or unnamed: a point cloud's points, a
  molecule's atoms, an event sequence, a set of pairs, and a first dim whose samples meet, ``[N, N]``, or
  that a softmax runs over, a zero-shot classifier's N prompts:
  :func:`~amp_compiler.onnx.measure.generated_inputs.pairwise_dims`) takes :data:`SET_SIZE`, then, refused,
  :data:`SHORTEST_SET`, then what the generic search gives it (1 where the model runs). At 1 a softmax
  over the dim is 1, a pairwise product one value, a difference along it (``x[1:] - x[:-1]``) EMPTY: the
  probe saw nothing and the conversion stated 0.00% where real sizes gave Inf, 50% flips or 57% (sweeps
  Q and S). A name shared by several inputs is one key, so it takes one size everywhere.

Why 16 for such a dim: it is the smallest power of two at which what runs along it looks like a real
size: a softmax's largest weight over 16 N(0, 1) scores is about 0.3 (at 1, exactly 1), a pairwise
product has 256 entries (240 off its diagonal), a difference 15 values, a mean or sum 16 terms whose
FP16 rounding accumulates. Its cost is linear in it for what runs per element (16x one element's, still
small beside a 128-token sequence) and quadratic for pairwise products (256x): 32 would be 4x that again
for no new kind of behaviour, and a model with several such dims multiplies them (the samples' memory
budget, :data:`~amp_compiler.runtime.samples.MAX_SAMPLE_BYTES`, falls back as for any refusal).

An image's height and width are the range probe's to size (:data:`~amp_compiler.onnx.measure.range_probe.
IMAGE_SIZES`): it passes the image's shape as ``fixed``, and a model's other inputs (a CLIP-like model's
token ids) are sized here beside it.

Only inputs all of whose dynamic dims get a size here are fixed; the search sizes the others: after
the sizes above and their fallbacks, every such dim (:data:`SET_SIZE` ones too) is the search's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import onnx

from amp_compiler.onnx.measure.generated_inputs import batch_dims, dim_key, dynamic_dims
from amp_compiler.runtime.input_kinds import constant_nodes, model_inputs, waveform_inputs

__all__ = [
    "DEFAULT_SEQUENCE", "MAX_SEQUENCE", "SET_SIZE", "SHORTEST_SEQUENCE", "SHORTEST_SET", "WAVEFORM_SAMPLES",
    "head_sizes", "position_table_size", "probe_dims", "probe_shapes",
]

#: A token sequence's length when the graph states none (no position table): a typical sentence-pair
#: or chat-turn length, wide enough for attention's softmax and score peaks to show.
DEFAULT_SEQUENCE = 128
#: The longest sequence the probe runs, whatever the position table allows (a 4096-row rotary cache
#: would make the probe's run, with every tensor observed, cost 32x a 128-token one in attention).
MAX_SEQUENCE = 512
#: The shortest sequence a refused one falls back to (:func:`_shorter`) before the generic search.
SHORTEST_SEQUENCE = 16
#: A waveform's lengths, in turn: one second at 16 kHz (speech models' rate; Silero VAD refuses all
#: but 8/16 kHz), then a 32 ms streaming chunk (a model that keeps a recurrent state between calls
#: takes one chunk per call and refuses a whole second: Silero VAD).
WAVEFORM_SAMPLES = (16000, 512)
#: The size of a dynamic dim that is no batch and nothing above sizes (points, atoms, pairs, events):
#: wide enough for a softmax, a pairwise product and a difference along it to be non-trivial (the
#: module doc says why 16).
SET_SIZE = 16
#: What a refused :data:`SET_SIZE` falls back to before the generic search (which starts at 1): still
#: more than one value to compare, pair or subtract.
SHORTEST_SET = 4
_PAST = re.compile(r"past", re.IGNORECASE)
_TOTAL = re.compile(r"total|all_?seq|kv_?seq", re.IGNORECASE)
#: A dim named like a sequence, or a time axis (a spectrogram's ``frames``, a Scan's ``T``: probed at 1,
#: a vocoder ran one frame, a running sum over time one step).
_SEQUENCE = re.compile(r"seq|len|token|frame|^t$|^time(_?steps?)?$", re.IGNORECASE)
#: Ops an arange of positions passes through on its way to the position table's Gather.
_POSITION_PATH = frozenset({"Unsqueeze", "Squeeze", "Reshape", "Expand", "Slice", "Cast", "Identity"})
#: Contrib ops that take a position table, and which input it is (its first dim is the positions).
_TABLE_INPUTS = {"EmbedLayerNormalization": 3, "GroupQueryAttention": 7, "RotaryEmbedding": 2}


def position_table_size(model: onnx.ModelProto) -> int:
    """The longest sequence the model's position table takes (0: none found): the largest constant
    table (an initializer, a Constant node) a Gather indexes with positions counting up
    (:func:`_first_position`), its rows less the first position (a table of 130 rows indexed from 2 takes
    128 tokens), or the rows of the position input of a fused embedding or attention op (onnxruntime's
    EmbedLayerNormalization, GroupQueryAttention's cos cache, RotaryEmbedding)."""
    inits = {i.name: i for i in model.graph.initializer}
    inits.update(constant_nodes(model.graph))  # TorchScript writes its position ids buffer as a Constant node
    producers = {out: node for node in model.graph.node for out in node.output}
    sizes = [0]
    for node in model.graph.node:
        index = _TABLE_INPUTS.get(node.op_type)
        if index is not None and len(node.input) > index and node.input[index] in inits:
            table = inits[node.input[index]]
            sizes.append(int(table.dims[0]) if table.dims else 0)
        elif node.op_type == "Gather" and len(node.input) > 1 and node.input[0] in inits:
            table = inits[node.input[0]]
            first = _first_position(node.input[1], producers, inits) if len(table.dims) == 2 else None
            if first is not None:
                sizes.append(max(int(table.dims[0]) - max(first, 0), 0))
    return max(sizes)


def head_sizes(model: onnx.ModelProto) -> dict[str, int]:
    """The head size of each KV-cache input a GroupQueryAttention reads (``past_key``, ``past_value``),
    by the key of its dynamic last dim: the query projection's width (a MatMul by an initializer, or
    a MatMulNBits) over ``num_heads``, or, packed with the keys and values (no key input), over ``num_heads + 2 *
    kv_num_heads``."""
    inits = {i.name: i for i in model.graph.initializer}
    producers = {out: node for node in model.graph.node for out in node.output}
    inputs = {i.name: i for i in model_inputs(model)}
    out: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type != "GroupQueryAttention" or len(node.input) < 5:
            continue
        attrs = {a.name: a.i for a in node.attribute}
        width = _projection_width(producers.get(node.input[0]), inits)
        if not width or not attrs.get("num_heads"):
            continue
        packed = len(node.input) < 2 or not node.input[1]
        heads = attrs["num_heads"] + (2 * attrs.get("kv_num_heads", 0) if packed else 0)
        if width % heads:
            continue
        for name in node.input[3:5]:
            info = inputs.get(name)
            dims = _dims(info) if info is not None else []
            if dims and not (dims[-1].HasField("dim_value") and dims[-1].dim_value > 0):
                out[dim_key(info, len(dims) - 1, dims[-1])] = width // heads  # type: ignore[arg-type]
    return out


def _projection_width(node: onnx.NodeProto | None, inits: Mapping[str, onnx.TensorProto]) -> int:
    """The output features of a projection: a MatMul by a 2-D initializer (its last dim), or a
    quantized one (onnxruntime's MatMulNBits: its ``N``); 0 for anything else."""
    if node is None:
        return 0
    if node.op_type == "MatMulNBits":
        return next((a.i for a in node.attribute if a.name == "N"), 0)
    weight = inits.get(node.input[1]) if node.op_type == "MatMul" and len(node.input) > 1 else None
    return int(weight.dims[1]) if weight is not None and len(weight.dims) == 2 else 0


def _first_position(
    name: str, producers: Mapping[str, onnx.NodeProto], inits: Mapping[str, onnx.TensorProto], depth: int = 0,
) -> int | None:
    """The first index of the positions ``name`` holds, where they count up by one (None: they do not,
    as far as the graph says): a Range's start (0 where it is not constant: a KV cache's past length,
    empty in the probe), 0 for an integer initializer counting 0, 1, 2..., 1 for a running count
    (CumSum: HF RoBERTa's positions, counted over the mask and multiplied by it), plus every constant an
    Add puts on the way (BART's and RoBERTa's offset of 2: their tables have two rows more than the
    positions they take), through reshapes, slices and Casts."""
    if depth > 12:
        return None
    if name in inits:
        array = onnx.numpy_helper.to_array(inits[name]).ravel()
        counts = array.size > 1 and array.dtype.kind in "iu" and bool((array == range(array.size)).all())
        return 0 if counts else None
    node = producers.get(name)
    if node is None or not node.input:
        return None
    if node.op_type == "Range":
        start = _constant_int(node.input[0], producers, inits)
        return start if start is not None else 0
    if node.op_type == "CumSum":
        return 1
    if node.op_type == "Add" and len(node.input) == 2:
        for constant, other in ((node.input[1], node.input[0]), (node.input[0], node.input[1])):
            added = _constant_int(constant, producers, inits)
            if added is not None:
                first = _first_position(other, producers, inits, depth + 1)
                return None if first is None else first + added
    if node.op_type in ("Add", "Mul") and len(node.input) == 2:  # plus a past length; times a mask of ones
        found = [_first_position(x, producers, inits, depth + 1) for x in node.input]
        return next((f for f in found if f is not None), None)
    if node.op_type not in _POSITION_PATH:
        return None
    return _first_position(node.input[0], producers, inits, depth + 1)


def _constant_int(
    name: str, producers: Mapping[str, onnx.NodeProto], inits: Mapping[str, onnx.TensorProto]
) -> int | None:
    """The value of a one-value integer constant (an initializer or a Constant node), else None."""
    tensor = inits.get(name)
    node = producers.get(name)
    if tensor is None and node is not None and node.op_type == "Constant":
        tensor = next((a.t for a in node.attribute if a.name == "value"), None)
    if tensor is None:
        return None
    array = onnx.numpy_helper.to_array(tensor)
    return int(array.ravel()[0]) if array.size == 1 and array.dtype.kind in "iu" else None


def probe_dims(model: onnx.ModelProto, fixed: Mapping[str, tuple[int, ...]] | None = None) -> list[dict[str, int]]:
    """The sizes to try, in turn, for the dynamic dims (by :func:`~amp_compiler.onnx.measure.
    generated_inputs.dynamic_dims`' keys), see the module doc: first the sizes the graph says real
    inputs have with every other non-batch dim at :data:`SET_SIZE`, then their fallbacks (shorter
    sequences, a streaming chunk, :data:`SHORTEST_SET`, the set dims left to the search). Empty when
    every dynamic dim is a batch."""
    fixed = fixed or {}
    keys = dynamic_dims(model, fixed)
    batch = batch_dims(model, keys)
    inputs = model_inputs(model)
    waveforms = waveform_inputs(model)
    table = position_table_size(model)
    heads = head_sizes(model)
    sequence = min(table, MAX_SEQUENCE) if table else DEFAULT_SEQUENCE
    out: dict[str, int] = {}
    waves: set[str] = set()
    sequences: list[str] = []  # the keys sized as the token sequence
    for info in inputs:
        if info.name in fixed or not info.type.tensor_type.elem_type:  # fixed, or no tensor
            continue
        dims = _dims(info)
        integer = onnx.helper.tensor_dtype_to_np_dtype(info.type.tensor_type.elem_type).kind in "iu"
        for axis, dim in enumerate(dims):
            key = dim_key(info, axis, dim)
            if key not in keys or key in out:
                continue
            if key in batch:
                out[key] = 1
            elif key in heads:
                out[key] = heads[key]
            elif info.name in waveforms and axis == len(dims) - 1:  # before names: Optimum's `sequence_length`
                out[key] = WAVEFORM_SAMPLES[0]
                waves.add(key)
            elif info.name in waveforms and axis == 1 and len(dims) == 3:  # [batch, channels, samples]: mono
                out[key] = 1
            elif _PAST.search(key):
                out[key] = 0
            elif _TOTAL.search(key) or (integer and len(dims) == 2 and axis == 1) or (
                    dim.HasField("dim_param") and _SEQUENCE.search(key)):
                out[key] = sequence
                sequences.append(key)
    sets = [key for key in keys if key not in out]  # no batch, and nothing above: points, atoms, pairs
    batches = {key: value for key, value in out.items() if key in batch}
    if not any(value > 1 or value == 0 for value in out.values()):
        out = {}  # nothing but batches: the search's own start
    shorter = [{**out, **dict.fromkeys(sequences, length)} for length in _shorter(sequence) if sequences]
    sized = [entry for entry in (out, *shorter, *({**out, **dict.fromkeys(waves, size)}
                                                  for size in WAVEFORM_SAMPLES[1:] if waves)) if entry]
    if not sets:
        return sized
    # each size above with the set dims at SET_SIZE, then the first with them at SHORTEST_SET, then the
    # sizes above alone (the set dims the search's: a model that refuses more than one there)
    tries = [*({**batches, **entry, **dict.fromkeys(sets, SET_SIZE)} for entry in sized or [{}]),
             {**batches, **(sized[0] if sized else {}), **dict.fromkeys(sets, SHORTEST_SET)}, *sized]
    return [{key: entry[key] for key in keys if key in entry} for entry in tries]  # in the inputs' order


def _shorter(sequence: int) -> list[int]:
    """The lengths a refused sequence falls back to before the generic search (which starts at one
    token): a half and a quarter of it, down to :data:`SHORTEST_SEQUENCE`. A model may refuse the length
    for what the graph does not say (positions counted otherwise than :func:`_first_position` follows,
    a length it must divide); one token shows no attention at all."""
    return [length for length in (sequence // 2, sequence // 4) if length >= SHORTEST_SEQUENCE]


def probe_shapes(
    model: onnx.ModelProto, values: Mapping[str, int], fixed: Mapping[str, tuple[int, ...]] | None = None
) -> dict[str, tuple[int, ...]]:
    """``fixed``'s shapes, and the shape of every other input all of whose dynamic dims ``values`` give
    (0 allowed: an empty KV cache); inputs with a dim ``values`` does not give are left to the search."""
    out = dict(fixed or {})
    for info in model_inputs(model):
        if info.name in out or not info.type.tensor_type.HasField("shape"):
            continue
        shape: list[int] = []
        for axis, dim in enumerate(_dims(info)):
            if dim.HasField("dim_value") and dim.dim_value > 0:
                shape.append(dim.dim_value)
            elif dim_key(info, axis, dim) in values:
                shape.append(values[dim_key(info, axis, dim)])
            else:
                break
        else:
            if any(dim_key(info, axis, dim) in values for axis, dim in enumerate(_dims(info))):
                out[info.name] = tuple(shape)
    return out


def _dims(info: onnx.ValueInfoProto) -> list[onnx.TensorShapeProto.Dimension]:
    tt = info.type.tensor_type
    return list(tt.shape.dim) if tt.HasField("shape") else []
