"""A converted model written as one file with its large weights streamed into it, one at a time.

Serializing a model whose weights are inside it builds the whole ModelProto (every converted weight
copied into protobuf) and then its serialization (every weight again): for a 500 MB FP32 model,
twice its FP16 size in memory at once. :func:`inline_chunks` serializes the model with each large
weight of the main graph as a placeholder (its ``raw_data`` empty), then gives the file's bytes in
chunks: the placeholder's framing with the lengths the real data makes, and each weight's bytes
made (converted, or read from the input file) only when its turn comes. Protobuf writes a message's
fields in field-number order, so the bytes are exactly those of the whole model serialized at once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import onnx
import onnx_ir as ir

from amp_compiler.onnx.load.deferred import DeferredTensor
from amp_compiler.onnx.load.inline_weights import RAW_DATA, TENSOR_NAME, encode_varint, fields
from amp_compiler.passes.onnx import ConvertedConstant
from amp_compiler.passes.onnx.lower import raw_bytes

__all__ = ["inline_chunks", "placeholders"]

#: Weights of the main graph of at least this many bytes are streamed.
STREAM_MIN_BYTES = 1 << 20
_MODEL_GRAPH, _GRAPH_INITIALIZER = 7, 5
_WHOLE_BYTES = (8, 16, 32, 64)


class _Placeholder(ir.LazyTensor):
    """A weight's name, type, shape, doc string and metadata, with no data."""

    def __init__(self, tensor: ir.TensorProtocol):
        super().__init__(
            lambda: None, tensor.dtype, tensor.shape, name=tensor.name,  # type: ignore[arg-type, return-value]
            doc_string=tensor.doc_string, metadata_props=dict(tensor.metadata_props),
        )

    def tobytes(self) -> bytes:
        return b""


def _streamable(tensor: ir.TensorProtocol) -> bool:
    return tensor.dtype.bitwidth in _WHOLE_BYTES and tensor.size > 0 and tensor.nbytes >= STREAM_MIN_BYTES


def inline_chunks(
    model: ir.Model, to_proto: Callable[[ir.Model], onnx.ModelProto]
) -> Iterator[bytes | memoryview]:
    """The bytes of ``to_proto(model)`` serialized, in chunks, each large weight read or converted
    when its chunk is asked for; weights left on disk that are not streamed are read into the model
    first (as :meth:`~amp_compiler.onnx.write.output.DeferredOutput.materialize` reads them)."""
    with placeholders(model, _streamable) as streamed:
        skeleton = to_proto(model).SerializeToString()
    return _splice(skeleton, streamed)


@contextlib.contextmanager
def placeholders(
    model: ir.Model, wanted: Callable[[ir.TensorProtocol], bool]
) -> Iterator[dict[str, ir.TensorProtocol]]:
    """While inside, each named initializer of ``model``'s main graph that is still on disk or still
    to convert (a DeferredTensor or a ConvertedConstant) and ``wanted`` is a placeholder (its type and
    shape, no data); every other DeferredTensor is read into memory. Gives the replaced tensors by
    name; ``model`` is as it was on exit."""
    replaced: dict[str, ir.TensorProtocol] = {}
    swapped: list[tuple[ir.Value, ir.TensorProtocol]] = []
    for graph in model.graphs():
        for value in graph.initializers.values():
            tensor = value.const_value
            if tensor is None:
                continue
            if (
                graph is model.graph and tensor.name and isinstance(tensor, (DeferredTensor, ConvertedConstant))
                and wanted(tensor)
            ):
                replaced[tensor.name] = tensor
                value.const_value = _Placeholder(tensor)
            elif isinstance(tensor, DeferredTensor):
                value.const_value = ir.Tensor(tensor.numpy(), name=tensor.name, doc_string=tensor.doc_string)
            else:
                continue
            swapped.append((value, tensor))
    try:
        yield replaced
    finally:
        for value, tensor in swapped:
            value.const_value = tensor


def _splice(skeleton: bytes, streamed: dict[str, ir.TensorProtocol]) -> Iterator[bytes | memoryview]:
    graph = next((f for f in fields(skeleton, 0, len(skeleton)) if f[0] == _MODEL_GRAPH), None)
    if graph is None or not streamed:
        yield skeleton
        return
    _, _, graph_start, graph_payload, graph_end = graph
    plan = []  # (field start, payload start, field end, raw_data field start, end, tensor, new payload size)
    size = graph_end - graph_payload
    for field, _, start, payload, end in fields(skeleton, graph_payload, graph_end):
        if field != _GRAPH_INITIALIZER:
            continue
        raw, name = None, None
        for sub, _, sub_start, sub_payload, sub_end in fields(skeleton, payload, end):
            if sub == RAW_DATA and sub_end == sub_payload:
                raw = (sub_start, sub_end)
            elif sub == TENSOR_NAME:
                name = skeleton[sub_payload:sub_end].decode()
        tensor = streamed.get(name) if name is not None else None
        if tensor is None or raw is None:
            continue
        tensor_size = (end - payload) - (raw[1] - raw[0]) + _field_size(RAW_DATA, tensor.nbytes)
        size += _field_size(_GRAPH_INITIALIZER, tensor_size) - (end - start)
        plan.append((start, payload, end, *raw, tensor, tensor_size))
    if len(plan) != len(streamed):  # a placeholder protobuf did not write: never write a model without a weight
        raise RuntimeError(f"{len(streamed) - len(plan)} weight(s) missing from the serialized model")
    yield skeleton[:graph_start] + _header(_MODEL_GRAPH, size)
    at = graph_payload
    for start, payload, end, raw_start, raw_end, tensor, tensor_size in plan:
        yield b"".join((
            skeleton[at:start], _header(_GRAPH_INITIALIZER, tensor_size), skeleton[payload:raw_start],
            _header(RAW_DATA, tensor.nbytes),
        ))
        data = raw_bytes(tensor.numpy())
        if data.nbytes != tensor.nbytes:
            raise RuntimeError(f"tensor {tensor.name!r} gave {data.nbytes} bytes, not {tensor.nbytes}")
        yield data
        del data
        yield skeleton[raw_end:end]
        at = end
    yield skeleton[at:]


def _header(field: int, length: int) -> bytes:
    """A length-delimited field's tag and length."""
    return encode_varint(field << 3 | 2) + encode_varint(length)


def _field_size(field: int, length: int) -> int:
    return len(_header(field, length)) + length
