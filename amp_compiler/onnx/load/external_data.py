"""External data: each tensor's location validated (where it may lead, a regular file holding the
bytes declared) before any byte is read, then read into the model.

Where a location may lead is :mod:`amp_compiler.onnx.load.locations`' rule (inside the model's folder,
or the blobs of the Hugging Face cache entry it is a snapshot of; the model file itself wherever its
path leads); a location it refuses is never opened. All locations are validated, and the files'
sizes checked, before the first byte is read.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO, NamedTuple

import onnx

from amp_compiler.errors import ModelLoadError
from amp_compiler.onnx.load.locations import names_itself, resolve_location
from amp_compiler.onnx.load.proto_walk import tagged_tensors
from amp_compiler.onnx.load.text import quote

__all__ = [
    "ELEMENT_BYTES", "ExternalRead", "external_fields", "load_external_data", "plan_external_reads",
    "read_external",
]

#: Bytes per element of the element types of whole bytes (onnx's TensorProto.DataType numbers).
ELEMENT_BYTES: dict[int, int] = {
    onnx.TensorProto.FLOAT: 4, onnx.TensorProto.UINT8: 1, onnx.TensorProto.INT8: 1,
    onnx.TensorProto.UINT16: 2, onnx.TensorProto.INT16: 2, onnx.TensorProto.INT32: 4,
    onnx.TensorProto.INT64: 8, onnx.TensorProto.BOOL: 1, onnx.TensorProto.FLOAT16: 2,
    onnx.TensorProto.DOUBLE: 8, onnx.TensorProto.UINT32: 4, onnx.TensorProto.UINT64: 8,
    onnx.TensorProto.COMPLEX64: 8, onnx.TensorProto.COMPLEX128: 16, onnx.TensorProto.BFLOAT16: 2,
    onnx.TensorProto.FLOAT8E4M3FN: 1, onnx.TensorProto.FLOAT8E4M3FNUZ: 1,
    onnx.TensorProto.FLOAT8E5M2: 1, onnx.TensorProto.FLOAT8E5M2FNUZ: 1,
}


class ExternalRead(NamedTuple):
    """One external tensor, validated and ready to read."""

    tensor: onnx.TensorProto
    file: Path  # the resolved file (amp_compiler.onnx.load.locations)
    offset: int
    length: int
    initializer: bool  # a dense initializer of the main graph or a subgraph (deferred loading may leave it on disk)
    itself: bool = False  # the bytes lie in the model file itself (large weights left inside it)


def external_fields(tensor: onnx.TensorProto, origin: str) -> tuple[str, int, int | None]:
    """A tensor's external data entries: (location, offset, length or None), numbers checked."""
    fields: dict[str, str] = {}
    for entry in tensor.external_data:
        fields[entry.key] = entry.value
    where = f"{origin}: tensor {quote(tensor.name)}"

    def number(key: str) -> int | None:
        if key not in fields:
            return None
        try:
            value = int(fields[key])
        except ValueError:
            raise ModelLoadError(f"{where}: external data {key} {quote(fields[key])} is not a number") from None
        if value < 0:
            raise ModelLoadError(f"{where}: external data {key} {value} is negative")
        return value

    return fields.get("location", ""), number("offset") or 0, number("length")


def _expected_bytes(tensor: onnx.TensorProto) -> int | None:
    size = ELEMENT_BYTES.get(tensor.data_type)
    if size is None:  # strings, 4-bit types: no fixed byte count to check here
        return None
    count = 1
    for d in tensor.dims:
        count *= d
    return count * size


def load_external_data(
    model: onnx.ModelProto, base: str | os.PathLike, origin: str = "model", *, itself: Path | None = None
) -> list[Path]:
    """Read every tensor's external data into the model, after validating its location.

    All locations are validated (and the files' sizes checked) before any byte is read. Returns the
    files read. Raises :class:`ModelLoadError` for a location the rule refuses
    (:mod:`amp_compiler.onnx.load.locations`), a missing file, or a file shorter than the tensor
    declares. ``itself``: the model file (its path as given), in the folder ``base``.
    """
    pending, sizes = plan_external_reads(model, base, origin, itself=itself)
    read_external(pending, origin)
    return list(sizes)


def plan_external_reads(
    model: onnx.ModelProto, base: str | os.PathLike, origin: str, *, itself: Path | None = None
) -> tuple[list[ExternalRead], dict[Path, int]]:
    """Validate every external tensor's location and size without reading a byte: one
    :class:`ExternalRead` per tensor, and the size of each file. ``itself``: the model file (its
    path as given), in the folder ``base``: a location naming it is read wherever its path leads."""
    base = Path(base)
    pending: list[ExternalRead] = []
    sizes: dict[Path, int] = {}
    for tensor, initializer in tagged_tensors(model):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        where = f"{origin}: tensor {quote(tensor.name)}"
        location, offset, length = external_fields(tensor, origin)
        target = resolve_location(location, base, where, itself)
        inside = names_itself(location, base, itself)
        file = "the model file" if inside else f"its external data file {quote(location)}"
        if target not in sizes:
            try:
                st = target.stat()
            except FileNotFoundError:
                raise ModelLoadError(f"{where}: {file} is missing") from None
            except OSError as exc:
                raise ModelLoadError(f"{where}: cannot read {file}: {exc.strerror or exc}") from None
            if not stat.S_ISREG(st.st_mode):
                raise ModelLoadError(f"{where}: external data location {quote(location)} is not a regular file")
            sizes[target] = st.st_size
        available = max(sizes[target] - offset, 0)
        expected = _expected_bytes(tensor)
        if length is None:
            length = expected if expected is not None else available
        if offset + length > sizes[target]:
            raise ModelLoadError(
                f"{where}: {file} is shorter than declared "
                f"({sizes[target]} bytes; the tensor needs bytes {offset} to {offset + length})"
            )
        if expected is not None and length != expected:
            raise ModelLoadError(
                f"{where}: external data length {length} does not match its shape "
                f"{list(tensor.dims)} ({expected} bytes)"
            )
        pending.append(ExternalRead(tensor, target, offset, length, initializer and expected is not None, inside))
    return pending, sizes


def read_external(pending: Iterable[ExternalRead], origin: str) -> None:
    """Read validated external tensors (from :func:`plan_external_reads`) into the model."""
    handles: dict[Path, BinaryIO] = {}
    try:
        for tensor, target, offset, length, _, itself in pending:
            f = handles.get(target)
            if f is None:
                f = handles[target] = open(target, "rb")
            f.seek(offset)
            data = f.read(length)
            if len(data) != length:  # the file shrank since it was checked
                what = "the model file shrank while it was read" if itself else (
                    "external data file is shorter than declared")
                raise ModelLoadError(f"{origin}: tensor {quote(tensor.name)}: {what}")
            tensor.raw_data = data
            tensor.data_location = onnx.TensorProto.DEFAULT
            del tensor.external_data[:]
    except OSError as exc:
        raise ModelLoadError(f"{origin}: cannot read its weights: {exc.strerror or exc}") from None
    finally:
        for f in handles.values():
            f.close()
