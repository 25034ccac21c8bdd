"""Large weights left on disk: the deferred model (proto side) and its tensors for the IR.

A :class:`DeferredModel` (from :func:`amp_compiler.onnx.load.files.load_model_deferred`) holds a model
whose large external initializers were validated but not read; :func:`defer_ir_tensors` binds them,
in the IR built from it, to :class:`DeferredTensor`, which reads its bytes from the validated file
each time they are needed (one weight in memory at a time).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import BinaryIO

import numpy as np
import onnx
import onnx_ir as ir

from amp_compiler.errors import ModelLoadError
from amp_compiler.onnx.load.external_data import plan_external_reads, read_external
from amp_compiler.onnx.load.text import quote

__all__ = ["DeferredModel", "DeferredTensor", "defer_ir_tensors", "with_small_weights"]


@dataclasses.dataclass
class DeferredModel:
    """A model whose large initializers stay in their external data files until they are needed.

    ``model`` holds every other tensor; each deferred initializer keeps its ``external_data``
    reference, whose location was validated like
    :func:`~amp_compiler.onnx.load.external_data.load_external_data`'s
    (:mod:`amp_compiler.onnx.load.locations`' rule, a regular file holding the bytes declared).
    ``locations`` maps each deferred tensor's location to that validated file; ``files`` lists the
    model file, then its external data files.
    """

    model: onnx.ModelProto
    files: list[Path]
    locations: dict[str, Path]
    checked: bool = True  # validated as check_model_valid validates (files.load_model_deferred(check=True))
    # The deferred weights lie in the model file itself (skimmed: amp_compiler.onnx.load.inline_weights),
    # and the converted model is written as one file too.
    inline: bool = False

    @property
    def deferred(self) -> bool:
        """True while some initializers are still on disk."""
        return bool(self.locations)

    def load(self) -> onnx.ModelProto:
        """Read the deferred tensors into ``model`` (all weights in memory, as ``files.load_model`` does)."""
        if self.locations:
            origin, itself = str(self.files[0]), self.files[0]
            pending = plan_external_reads(self.model, itself.parent, origin, itself=itself)[0]
            read_external(pending, origin)
            if self.inline:  # the tensors as the file holds them (no data_location field)
                for entry in pending:
                    entry.tensor.ClearField("data_location")
            self.locations, self.inline = {}, False
        return self.model


def with_small_weights(deferred: DeferredModel, limit: int = 2**20) -> onnx.ModelProto:
    """A copy of the deferred model with its deferred tensors of at most ``limit`` bytes read in, for
    tools that read the values of constants (onnxruntime's symbolic shape inference reads a
    constant-folded embedding as readily as a Reshape's shape); larger ones stay on disk."""
    if not deferred.locations:
        return deferred.model
    copy = onnx.ModelProto()
    copy.CopyFrom(deferred.model)
    origin, itself = str(deferred.files[0]), deferred.files[0]
    pending = plan_external_reads(copy, itself.parent, origin, itself=itself)[0]
    read_external([entry for entry in pending if entry.length <= limit], origin)
    return copy


_COPY_CHUNK = 64 * 2**20  # tofile copies a tensor in pieces of this many bytes


class DeferredTensor(ir.ExternalTensor):
    """An initializer ``files.load_model_deferred`` left on disk, for the IR.

    Its bytes are read from the validated file each time they are asked for (plain reads, nothing
    memory-mapped or kept), so a pass that looks at every weight in turn holds one at a time.
    """

    __slots__ = ("_file", "_inline")

    def __init__(self, tensor: ir.ExternalTensor, file: Path, *, inline: bool = False):
        super().__init__(
            tensor.location, tensor.offset, tensor.length, tensor.dtype, shape=tensor.shape,
            name=tensor.name, doc_string=tensor.doc_string, metadata_props=dict(tensor.metadata_props),
            base_dir=file.parent,
        )
        self._file = file
        self._inline = inline  # the bytes lie in the model file itself (skimmed), not in external data

    def _read(self, f: BinaryIO, count: int) -> bytes:
        data = f.read(count)
        if len(data) != count:
            raise self._shrank()
        return data

    def _shrank(self) -> ModelLoadError:
        """The error when the file shrank since it was validated."""
        if self._inline:
            return ModelLoadError(f"{self._file}: the model file shrank while tensor {quote(self.name)} was read")
        return ModelLoadError(f"{self._file}: external data of tensor {quote(self.name)} is shorter than declared")

    def tobytes(self) -> bytes:
        with open(self._file, "rb") as f:
            f.seek(self.offset or 0)
            return self._read(f, self.length if self.length is not None else self.nbytes)

    def numpy(self) -> np.ndarray:
        if self.dtype.bitwidth not in (8, 16, 32, 64) or self.size == 0:
            array = super().numpy().copy()  # packed sub-byte types: onnx_ir unpacks them
            super().release()
            return array
        dtype = np.dtype(self.dtype.numpy()).newbyteorder("<")
        return np.frombuffer(self.tobytes(), dtype=dtype, count=self.size).reshape(self.shape.numpy())

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        array = self.numpy()
        return array if dtype is None else array.astype(dtype)

    def tofile(self, file: BinaryIO) -> None:
        with open(self._file, "rb") as f:
            f.seek(self.offset or 0)
            left = self.length if self.length is not None else self.nbytes
            while left > 0:
                chunk = self._read(f, min(_COPY_CHUNK, left))
                file.write(chunk)
                left -= len(chunk)

    def tofile_as(self, file: BinaryIO, dtype: np.dtype) -> None:
        """Write the tensor's values converted to ``dtype`` (little-endian, as ``raw_data`` holds them),
        read and converted ``_COPY_CHUNK`` bytes at a time into two buffers reused for every chunk:
        no copy of the whole tensor, in either type. Values beyond ``dtype``'s range become infinite,
        as numpy's ``astype`` makes them."""
        source = np.dtype(self.dtype.numpy()).newbyteorder("<")
        target = np.dtype(dtype).newbyteorder("<")
        per_chunk = max(1, _COPY_CHUNK // source.itemsize)
        raw = bytearray(min(self.size, per_chunk) * source.itemsize)
        out = np.empty(min(self.size, per_chunk), target)
        with open(self._file, "rb") as f, np.errstate(over="ignore"):
            f.seek(self.offset or 0)
            left = self.size
            while left > 0:
                n = min(left, per_chunk)
                view = memoryview(raw)[: n * source.itemsize]
                if f.readinto(view) != len(view):
                    raise self._shrank()
                np.copyto(out[:n], np.frombuffer(raw, source, count=n), casting="unsafe")
                file.write(out[:n].view(np.uint8).data)
                left -= n

    def release(self) -> None:
        super().release()


def defer_ir_tensors(model: ir.Model, locations: dict[str, Path], *, inline: bool = False) -> int:
    """Bind the external initializers of an IR model built from a :class:`DeferredModel`'s proto to
    their validated files (:class:`DeferredTensor`). Returns how many were bound. ``inline``: they
    lie in the model file itself (``DeferredModel.inline``)."""
    n = 0
    for graph in model.graphs():
        for name, value in graph.initializers.items():
            tensor = value.const_value
            if isinstance(tensor, ir.ExternalTensor) and not isinstance(tensor, DeferredTensor):
                file = locations.get(str(tensor.location))
                if file is None:
                    raise ModelLoadError(f"tensor {quote(name)}: external data that was not validated")
                value.const_value = DeferredTensor(tensor, file, inline=inline)
                n += 1
    return n
