"""External data: each tensor's location validated (inside the model's folder, a regular file holding
the bytes declared) before any byte is read, then read into the model.

A location is refused without opening anything when it is absolute, holds ``..`` or a NUL, or
resolves (through symlinks) outside the model's folder. All locations are validated, and the files'
sizes checked, before the first byte is read.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import BinaryIO, NamedTuple

import onnx

from amp_compiler.errors import ModelLoadError
from amp_compiler.onnx.load.proto_walk import tagged_tensors
from amp_compiler.onnx.load.text import quote

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
    file: Path  # the resolved file, inside the model's folder
    offset: int
    length: int
    initializer: bool  # a dense initializer of the main graph or a subgraph (deferred loading may leave it on disk)


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


def _resolve_location(location: str, base: Path, where: str) -> Path:
    """The file an external data ``location`` names, refused (without touching it) unless it lies
    inside ``base``."""
    if not location:
        raise ModelLoadError(f"{where}: stored as external data but names no location")
    if "\x00" in location:
        raise ModelLoadError(f"{where}: external data location {quote(location)} contains a NUL character")
    posix, windows = PurePosixPath(location), PureWindowsPath(location)
    if posix.is_absolute() or windows.is_absolute() or windows.drive or location.startswith(("/", "\\")):
        raise ModelLoadError(
            f"{where}: external data location {quote(location)} is an absolute path; refused "
            "(external data must lie in the model's folder)"
        )
    if ".." in posix.parts or ".." in windows.parts:
        raise ModelLoadError(
            f"{where}: external data location {quote(location)} escapes the model's folder ('..'); refused"
        )
    root = Path(os.path.realpath(base))
    target = Path(os.path.realpath(root / location))
    if target != root and root not in target.parents:
        raise ModelLoadError(
            f"{where}: external data location {quote(location)} resolves (through a symlink) outside the "
            "model's folder; refused"
        )
    return target


def _expected_bytes(tensor: onnx.TensorProto) -> int | None:
    size = ELEMENT_BYTES.get(tensor.data_type)
    if size is None:  # strings, 4-bit types: no fixed byte count to check here
        return None
    count = 1
    for d in tensor.dims:
        count *= d
    return count * size


def load_external_data(model: onnx.ModelProto, base: str | os.PathLike, origin: str = "model") -> list[Path]:
    """Read every tensor's external data into the model, after validating its location.

    All locations are validated (and the files' sizes checked) before any byte is read. Returns the
    files read. Raises :class:`ModelLoadError` for a location outside ``base``, a missing file, or a
    file shorter than the tensor declares.
    """
    pending, sizes = plan_external_reads(model, base, origin)
    read_external(pending, origin)
    return list(sizes)


def plan_external_reads(
    model: onnx.ModelProto, base: str | os.PathLike, origin: str
) -> tuple[list[ExternalRead], dict[Path, int]]:
    """Validate every external tensor's location and size without reading a byte: one
    :class:`ExternalRead` per tensor, and the size of each file."""
    base = Path(base)
    pending: list[ExternalRead] = []
    sizes: dict[Path, int] = {}
    for tensor, initializer in tagged_tensors(model):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        where = f"{origin}: tensor {quote(tensor.name)}"
        location, offset, length = external_fields(tensor, origin)
        target = _resolve_location(location, base, where)
        if target not in sizes:
            try:
                st = target.stat()
            except FileNotFoundError:
                raise ModelLoadError(f"{where}: its external data file {quote(location)} is missing") from None
            except OSError as exc:
                raise ModelLoadError(
                    f"{where}: cannot read its external data file {quote(location)}: {exc.strerror or exc}"
                ) from None
            if not stat.S_ISREG(st.st_mode):
                raise ModelLoadError(f"{where}: external data location {quote(location)} is not a regular file")
            sizes[target] = st.st_size
        available = max(sizes[target] - offset, 0)
        expected = _expected_bytes(tensor)
        if length is None:
            length = expected if expected is not None else available
        if offset + length > sizes[target]:
            raise ModelLoadError(
                f"{where}: its external data file {quote(location)} is shorter than declared "
                f"({sizes[target]} bytes; the tensor needs bytes {offset} to {offset + length})"
            )
        if expected is not None and length != expected:
            raise ModelLoadError(
                f"{where}: external data length {length} does not match its shape "
                f"{list(tensor.dims)} ({expected} bytes)"
            )
        pending.append(ExternalRead(tensor, target, offset, length, initializer and expected is not None))
    return pending, sizes


def read_external(pending: Iterable[ExternalRead], origin: str) -> None:
    """Read validated external tensors (from :func:`plan_external_reads`) into the model."""
    handles: dict[Path, BinaryIO] = {}
    try:
        for tensor, target, offset, length, _ in pending:
            f = handles.get(target)
            if f is None:
                f = handles[target] = open(target, "rb")
            f.seek(offset)
            data = f.read(length)
            if len(data) != length:  # the file shrank since it was checked
                raise ModelLoadError(
                    f"{origin}: tensor {quote(tensor.name)}: external data file is shorter than declared"
                )
            tensor.raw_data = data
            tensor.data_location = onnx.TensorProto.DEFAULT
            del tensor.external_data[:]
    except OSError as exc:
        raise ModelLoadError(f"{origin}: cannot read external data: {exc.strerror or exc}") from None
    finally:
        for f in handles.values():
            f.close()
