"""Large weights inside a model file, described as external data at their place in that file, unparsed.

Parsing a 500 MB model copies every weight out of the file into protobuf (and the file's bytes are in
memory while it parses): 1 GB for a model whose conversion reads each weight once. :func:`skim`
reads the file's protobuf framing instead, down to the main graph's initializers, and gives the
model's bytes with the ``raw_data`` of each initializer of ``min_bytes`` or more replaced by an
external data reference to the same bytes in the model file itself (``location`` = the file's
name, ``offset``, ``length``). Parsed, that is the model with those weights left on disk, which
the external-data machinery (:mod:`amp_compiler.onnx.load.deferred`) validates and reads one at a time.

Only the plain layout is skimmed: one ``graph`` field, initializers whose data is one ``raw_data``
field and nothing else (no typed data fields, segments or external data). Anything else (and any
framing that does not add up: the file is untrusted) gives None, and the file is parsed as a whole.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from pathlib import Path

from amp_compiler.onnx.load.external_data import ELEMENT_BYTES

__all__ = ["RAW_DATA", "TENSOR_NAME", "encode_varint", "fields", "skim"]

_VARINT, _FIXED64, _BYTES, _FIXED32 = 0, 1, 2, 5
_MODEL_GRAPH, _GRAPH_INITIALIZER = 7, 5
_DIMS, _DATA_TYPE, TENSOR_NAME, RAW_DATA, _DOC_STRING, _EXTERNAL_DATA, _DATA_LOCATION, _METADATA = (
    1, 2, 8, 9, 12, 13, 14, 16
)
#: TensorProto fields an initializer may have to be skimmed (anything else stays as it is).
_PLAIN_TENSOR_FIELDS = frozenset({_DIMS, _DATA_TYPE, TENSOR_NAME, RAW_DATA, _DOC_STRING, _METADATA})
_EXTERNAL = 1  # TensorProto.DataLocation.EXTERNAL



class Malformed(Exception):
    """The framing does not add up (the file is left to protobuf's parser, which names the fault)."""


def _varint(data: mmap.mmap | bytes, pos: int, end: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if pos >= end or shift > 63:
            raise Malformed
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def fields(data: mmap.mmap | bytes, start: int, end: int) -> Iterator[tuple[int, int, int, int, int]]:
    """(field number, wire type, field start, payload start, payload end) of each field in data[start:end]
    (raises :class:`Malformed` where the framing does not add up)."""
    pos = start
    while pos < end:
        field_start = pos
        tag, pos = _varint(data, pos, end)
        field, wire = tag >> 3, tag & 7
        if wire == _VARINT:
            payload = pos
            _, pos = _varint(data, pos, end)
        elif wire == _BYTES:
            length, pos = _varint(data, pos, end)
            payload, pos = pos, pos + length
        elif wire == _FIXED64:
            payload, pos = pos, pos + 8
        elif wire == _FIXED32:
            payload, pos = pos, pos + 4
        else:  # groups: never in ONNX
            raise Malformed
        if pos > end or field == 0:
            raise Malformed
        yield field, wire, field_start, payload, pos


def _bytes_field(field: int, payload: bytes) -> bytes:
    return encode_varint(field << 3 | _BYTES) + encode_varint(len(payload)) + payload


def _external_entry(key: str, value: str) -> bytes:
    return _bytes_field(_EXTERNAL_DATA, _bytes_field(1, key.encode()) + _bytes_field(2, value.encode()))


def _skim_tensor(data: mmap.mmap, start: int, end: int, location: str, min_bytes: int) -> bytes | None:
    """The TensorProto in data[start:end] with its raw_data made an external reference (None: leave it)."""
    kept: list[bytes] = []
    raw: tuple[int, int] | None = None
    data_type = None
    for field, wire, field_start, payload, field_end in fields(data, start, end):
        if field not in _PLAIN_TENSOR_FIELDS:
            return None
        if field == RAW_DATA:
            if raw is not None or wire != _BYTES:
                return None
            raw = (payload, field_end)
            continue
        if field == _DATA_TYPE:
            data_type = _varint(data, payload, field_end)[0] if wire == _VARINT else None
        kept.append(data[field_start:field_end])
    if raw is None or raw[1] - raw[0] < min_bytes or data_type not in ELEMENT_BYTES:
        return None  # packed 4-bit types and strings stay: their length does not follow from a byte count
    offset, length = raw[0], raw[1] - raw[0]
    kept += [
        _external_entry("location", location), _external_entry("offset", str(offset)),
        _external_entry("length", str(length)),
        encode_varint(_DATA_LOCATION << 3 | _VARINT) + encode_varint(_EXTERNAL),
    ]
    return b"".join(kept)


def skim(path: Path, min_bytes: int) -> bytes | None:
    """The model file's bytes with the main graph's initializers of at least ``min_bytes`` of raw
    data described as external data in the file itself (see the module doc); None when there is
    none, or the file's layout is not the plain one (it is then parsed as a whole)."""
    with open(path, "rb") as f:
        try:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (ValueError, OSError):  # empty, or not mappable
            return None
    try:
        return _skim(data, path.name, min_bytes)
    except Malformed:
        return None
    finally:
        data.close()


def _skim(data: mmap.mmap, location: str, min_bytes: int) -> bytes | None:
    graphs = [f for f in fields(data, 0, len(data)) if f[0] == _MODEL_GRAPH]
    if len(graphs) != 1 or graphs[0][1] != _BYTES:
        return None
    _, _, graph_start, graph_payload, graph_end = graphs[0]
    parts: list[bytes] = []
    copied = graph_payload  # graph bytes before this position are already in parts
    skimmed = 0
    for field, wire, field_start, payload, field_end in fields(data, graph_payload, graph_end):
        if field != _GRAPH_INITIALIZER or wire != _BYTES or field_end - payload < min_bytes:
            continue
        tensor = _skim_tensor(data, payload, field_end, location, min_bytes)
        if tensor is None:
            continue
        parts += [data[copied:field_start], _bytes_field(_GRAPH_INITIALIZER, tensor)]
        copied = field_end
        skimmed += 1
    if not skimmed:
        return None
    parts.append(data[copied:graph_end])
    graph = b"".join(parts)
    return b"".join((data[:graph_start], _bytes_field(_MODEL_GRAPH, graph), data[graph_end:]))
