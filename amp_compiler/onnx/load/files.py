"""Reading a model file safely: every failure is a :class:`ModelLoadError` with one line that names it.

A model file is untrusted input (people convert files they downloaded): missing, empty, not a regular
file, over protobuf's 2 GiB limit, not protobuf, truncated, nested deeper than protobuf parses, or
invalid (:mod:`amp_compiler.onnx.load.validate`). Its external data is read by
:mod:`amp_compiler.onnx.load.external_data`, never by onnx; :func:`load_model_deferred` leaves the large
weights on disk (:mod:`amp_compiler.onnx.load.deferred`).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from amp_compiler.errors import ModelLoadError
from amp_compiler.onnx.load.deferred import DeferredModel
from amp_compiler.onnx.load.external_data import (
    external_fields,
    load_external_data,
    plan_external_reads,
    read_external,
)
from amp_compiler.onnx.load.inline_weights import skim as skim_weights
from amp_compiler.onnx.load.text import first_line
from amp_compiler.onnx.load.validate import check_model_valid

__all__ = ["DEFER_MIN_BYTES", "PROTOBUF_LIMIT", "load_model", "load_model_and_files", "load_model_deferred"]

#: Protobuf cannot serialize or parse one message of 2 GiB or more.
PROTOBUF_LIMIT = 2**31 - 1


def load_model(path: str | os.PathLike) -> onnx.ModelProto:
    """Load and validate an ONNX model file (external data is read, after validation, from beside it)."""
    return load_model_and_files(path)[0]


def load_model_and_files(path: str | os.PathLike) -> tuple[onnx.ModelProto, list[Path]]:
    """Like :func:`load_model`, also returning every file read: the model, then its external data files."""
    p = Path(path)
    model, may_refer_to_files = _parse_model_file(p)
    files = [p, *(load_external_data(model, p.parent, origin=str(p), itself=p) if may_refer_to_files else [])]
    check_model_valid(model, origin=str(p))
    return model, files


#: Deferred loading leaves initializers of at least this many bytes on disk; smaller external
#: tensors (shapes, scales: what shape inference reads) are read into the model.
DEFER_MIN_BYTES = 64 * 1024


def load_model_deferred(
    path: str | os.PathLike, min_bytes: int = DEFER_MIN_BYTES, *, check: bool = True,
    skim_file_bytes: int | None = None,
) -> DeferredModel:
    """Load and validate a model file, leaving its large external-data initializers on disk.

    Every external data location is validated as :func:`load_model` validates it, and the model is
    checked as :func:`~amp_compiler.onnx.load.validate.check_model_valid` checks it; only the bytes of
    initializers of ``min_bytes`` or more are not read (:class:`~amp_compiler.onnx.load.deferred.DeferredTensor`
    reads them, one at a time, when needed). A model without external data is loaded whole.
    ``check=False`` leaves the model checks to the caller (``DeferredModel.checked`` is False):
    :func:`amp_compiler.onnx.convert.convert` does them while it builds the IR.

    A model file of ``skim_file_bytes`` or more (default ``SKIM_MIN_FILE_BYTES``) with its weights
    inside it has them left in the file the same way (:mod:`amp_compiler.onnx.load.inline_weights`:
    ``DeferredModel.inline``), and its conversion is written as one file.
    """
    p = Path(path)
    skim_file_bytes = SKIM_MIN_FILE_BYTES if skim_file_bytes is None else skim_file_bytes
    model, may_refer_to_files = _parse_model_file(p, skim=(min_bytes, skim_file_bytes))
    pending, sizes = plan_external_reads(model, p.parent, str(p), itself=p) if may_refer_to_files else ([], {})
    read_external([entry for entry in pending if not (entry.initializer and entry.length >= min_bytes)], str(p))
    locations = {
        external_fields(entry.tensor, str(p))[0]: entry.file
        for entry in pending
        if entry.initializer and entry.length >= min_bytes
    }
    if check:
        check_model_valid(model, origin=str(p), deferred=bool(locations))
    itself = Path(os.path.realpath(p))  # skimmed weights lie in the model file itself
    files = [p, *(f for f in sizes if f != itself)]
    inline = bool(locations) and all(f == itself for f in locations.values())
    return DeferredModel(model, files, locations, checked=check, inline=inline)


#: Model files of at least this size have their large weights skimmed (left in the file, unparsed).
SKIM_MIN_FILE_BYTES = 16 * 2**20


def _parse_model_file(p: Path, skim: tuple[int, int] | None = None) -> tuple[onnx.ModelProto, bool]:
    """The parsed model, and whether it may refer to external data files. Every external tensor
    names its "location": a file without the word has none, and its external-data walk is skipped
    (a tensor marked external without a location is then refused by the model checks).
    ``skim``: (weight bytes, file bytes): a file of at least that many bytes is parsed with its
    initializers of that many bytes or more described as external data in the file itself
    (:mod:`amp_compiler.onnx.load.inline_weights`)."""
    data = _read_model_bytes(p, skim)
    if _looks_like_pytorch(data):
        raise ModelLoadError(
            f"{p}: not ONNX: looks like a PyTorch checkpoint; export it with torch.onnx.export or use amp_compiler.fx"
        )
    may_refer_to_files = b"location" in data
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except DecodeError as exc:
        detail = first_line(exc)
        if "depth" in detail.lower() or "recursion" in detail.lower():
            raise ModelLoadError(
                f"{p}: nests messages deeper than protobuf can parse (subgraphs inside subgraphs, "
                f"about 30 levels at most): {detail}"
            ) from None
        raise ModelLoadError(f"{p}: not an ONNX model or truncated (protobuf parse failed: {detail})") from None
    except (RuntimeError, ValueError) as exc:
        raise ModelLoadError(f"{p}: not an ONNX model (protobuf parse failed: {first_line(exc)})") from None
    del data
    if not model.HasField("graph") or (not model.graph.node and not model.graph.output):
        raise ModelLoadError(f"{p}: parses as protobuf but holds no ONNX graph (is it an ONNX model file?)")
    if not model.opset_import:
        raise ModelLoadError(f"{p}: the model imports no opset")
    return model, may_refer_to_files


def _looks_like_pytorch(data: bytes) -> bool:
    """``torch.save``'s formats: a zip archive holding ``data.pkl`` (since PyTorch 1.6), or a bare
    pickle (protocol 2 to 5; older checkpoints). Neither can be an ONNX model: a ModelProto starts
    with a field tag, never ``PK\\x03\\x04`` nor ``\\x80`` followed by a protocol number."""
    if data.startswith(b"PK\x03\x04"):
        return b"data.pkl" in data[:1 << 20] or b"/data/" in data[:1 << 20]
    return len(data) > 2 and data[0] == 0x80 and 2 <= data[1] <= 5


def _read_model_bytes(p: Path, skim: tuple[int, int] | None = None) -> bytes:
    try:
        st = p.stat()
    except FileNotFoundError:
        raise ModelLoadError(f"{p}: no such file") from None
    except OSError as exc:
        raise ModelLoadError(f"{p}: cannot read: {exc.strerror or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        raise ModelLoadError(f"{p}: is a directory, not an ONNX model file")
    if not stat.S_ISREG(st.st_mode):
        raise ModelLoadError(f"{p}: is not a regular file (a device, pipe or socket), not an ONNX model file")
    if st.st_size == 0:
        raise ModelLoadError(f"{p}: the file is empty, not an ONNX model")
    if st.st_size > PROTOBUF_LIMIT:
        raise ModelLoadError(
            f"{p}: the file is {st.st_size / 2**30:.2f} GiB, over protobuf's 2 GiB limit for one message; "
            "a model this large must keep its weights as external data "
            "(onnx.save_model(model, path, save_as_external_data=True))"
        )
    try:
        skimmed = skim_weights(p, skim[0]) if skim is not None and st.st_size >= skim[1] else None
        if skimmed is not None:
            return skimmed
        with open(p, "rb") as f:
            return f.read()
    except OSError as exc:
        raise ModelLoadError(f"{p}: cannot read: {exc.strerror or exc}") from None
