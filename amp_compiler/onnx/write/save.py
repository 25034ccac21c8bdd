"""Writing a converted model (or a report) atomically, to an output path checked once, never over the input's files.

:func:`check_output_path` checks where the output goes (a writable folder, not a directory, not the
input model or its external data) and returns an :class:`OutputPath`; its writes go to a temporary
file in the destination folder, renamed into place only once complete, so a failed conversion never
leaves a partial output (an existing file at the output path stays as it was). A ``verify``
callback sees the complete temporary model before it is renamed (the load check), and may refuse
it. New files get the permissions the umask gives (as ``open`` would); a replaced file keeps its own.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import cast

import onnx
import onnx_ir as ir
from google.protobuf.message import EncodeError

from amp_compiler.errors import OutputError
from amp_compiler.onnx.load.text import first_line, quote

__all__ = ["InputOverwriteError", "OutputPath", "Verify", "check_output_path", "save_model"]

_PAGE = 4096  # offsets of tensors in a data file we write: page-aligned, so runtimes can map them

#: Called with the complete temporary model file before it is renamed into place; raising refuses it.
Verify = Callable[[Path], None]


class InputOverwriteError(OutputError):
    """The output path is the input model itself, and overwriting it was not allowed (``force``)."""


@dataclasses.dataclass(frozen=True)
class OutputPath:
    """An output path that passed :func:`check_output_path`; its ``write_*`` methods write to it atomically.

    ``input_files``: the files the input was read from, the model file first, which no write may
    replace (``force``: the model file itself may be replaced, its external data never).
    """

    path: Path
    input_files: tuple[Path, ...] = ()
    force: bool = False

    @property
    def folder(self) -> Path:
        return self.path.parent if str(self.path.parent) else Path(".")

    def with_external_data(self, files: Iterable[str | os.PathLike]) -> OutputPath:
        """This path, refused if it is one of ``files`` (the input's external data files, known only
        once the model is read), which later writes also keep clear of."""
        added = [Path(f) for f in files]
        for f in added:
            if _same_file(self.path, f):
                raise OutputError(f"{self.path}: the output would overwrite the input model's external data; refused")
        return dataclasses.replace(self, input_files=self.input_files + tuple(added))

    def write_model(self, model: onnx.ModelProto, verify: Verify | None = None) -> None:
        """Serialize ``model`` into the output file (:meth:`write_bytes`; ``verify`` as there)."""
        try:
            data = model.SerializeToString()
        except (ValueError, EncodeError) as exc:  # protobuf refuses messages of 2 GiB or more (upb: EncodeError)
            raise OutputError(f"{self.path}: cannot write the converted model: {first_line(exc)}") from None
        self.write_bytes(data, verify)

    def write_bytes(self, data: bytes, verify: Verify | None = None) -> None:
        """Write ``data`` to the output file: a temporary file, seen complete by ``verify`` (which may
        raise to refuse it), then renamed over the output, so a failure at any point leaves the output
        as it was and no temporary file behind."""
        self.write_chunks([data], verify)

    def write_chunks(
        self, chunks: Iterable[bytes | memoryview], verify: Verify | None = None, *, limit: int | None = None
    ) -> None:
        """:meth:`write_bytes` of the concatenated ``chunks``, each written as it comes; ``limit``: the
        most bytes the file may hold (a model over protobuf's 2 GiB cannot be read back: refused)."""
        out, folder = self.path, self.folder
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{out.name[:100]}.", suffix=".tmp", dir=folder)
        except OSError as exc:
            raise OutputError(f"{out}: the output folder {folder} is not writable: {exc.strerror or exc}") from None
        try:
            with os.fdopen(fd, "wb") as f:
                for chunk in chunks:
                    f.write(chunk)
                    if limit is not None and f.tell() > limit:
                        raise OutputError(f"{out}: cannot write the converted model: over protobuf's 2 GiB limit")
                f.flush()
                os.fsync(f.fileno())
            if verify is not None:
                verify(Path(tmp))
            os.chmod(tmp, _new_file_mode(out))
            os.replace(tmp, out)
        except OSError as exc:
            Path(tmp).unlink(missing_ok=True)
            raise OutputError(f"{out}: cannot write: {exc.strerror or exc}") from None
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def write_ir_model(
        self, model: ir.Model, to_proto: Callable[[ir.Model], onnx.ModelProto], *, min_bytes: int = 1024,
        verify: Verify | None = None,
    ) -> Path | None:
        """Write an IR model with its initializers of ``min_bytes`` or more in ``<path>.data`` beside it.

        Tensors are written one at a time (a tensor still on disk is copied in chunks), so writing
        holds no more memory than the model already does; the ModelProto (``to_proto(model)``, called
        while the initializers are references to the data file) stays small. Both files are written
        under their final names in a temporary folder beside the output (so ``verify`` sees the model
        with its data, as it will be), then renamed into place, the data file first (an earlier one
        kept aside until the model file is in place), so a failure leaves the output as it was and no
        temporary file; ``model`` is left as it was. The data file may not be one of the input's
        files. Returns the data file, or None when no tensor was large enough to need one.
        """
        out, folder, files = self.path, self.folder, self.input_files
        data_path = folder / f"{out.name}.data"
        if any(_same_file(data_path, f) for f in files):
            raise OutputError(f"{out}: its data file {data_path.name} would overwrite the input model's files; refused")
        if data_path.exists() and not data_path.is_file():
            raise OutputError(f"{out}: its data file {data_path} exists and is not a regular file")
        moved: list[tuple[ir.Value, ir.TensorProtocol]] = []
        staging = backup = None
        try:
            staging = Path(tempfile.mkdtemp(prefix=f".{out.name[:100]}.", suffix=".tmp", dir=folder))
            tmp_data, tmp_model = staging / data_path.name, staging / out.name
            with open(tmp_data, "xb") as f:
                offset = 0
                for graph in model.graphs():
                    for name, value in graph.initializers.items():
                        tensor = value.const_value
                        if tensor is None or tensor.dtype == ir.DataType.STRING or tensor.nbytes < min_bytes:
                            continue
                        pad = -offset % _PAGE
                        f.write(b"\0" * pad)
                        offset += pad
                        if hasattr(tensor, "tofile"):
                            tensor.tofile(f)
                        else:
                            f.write(tensor.tobytes())
                        if f.tell() != offset + tensor.nbytes:
                            written = f.tell() - offset
                            raise OutputError(f"{out}: tensor {quote(name)} wrote {written} bytes, not {tensor.nbytes}")
                        moved.append((value, tensor))
                        value.const_value = ir.ExternalTensor(
                            data_path.name, offset, tensor.nbytes, tensor.dtype, shape=cast(ir.Shape, tensor.shape),
                            name=name, doc_string=tensor.doc_string,
                            metadata_props=dict(tensor.metadata_props), base_dir=folder,
                        )
                        offset += tensor.nbytes
                f.flush()
                os.fsync(f.fileno())
            proto = to_proto(model)
            try:
                data = proto.SerializeToString()
            except (ValueError, EncodeError) as exc:  # over 2 GiB even with the weights outside
                raise OutputError(f"{out}: cannot write the converted model: {first_line(exc)}") from None
            with open(tmp_model, "xb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            if not moved:
                tmp_data.unlink()
            if verify is not None:
                verify(tmp_model)
            os.chmod(tmp_model, _new_file_mode(out))
            if moved:
                os.chmod(tmp_data, _new_file_mode(data_path))
                if data_path.exists():  # an earlier output's data: kept aside until the model is in place
                    fd, backup = tempfile.mkstemp(prefix=f".{data_path.name[:100]}.", suffix=".old.tmp", dir=folder)
                    os.close(fd)
                    os.replace(data_path, backup)
                os.replace(tmp_data, data_path)
                try:
                    os.replace(tmp_model, out)
                except BaseException:
                    data_path.unlink(missing_ok=True)
                    if backup is not None:
                        os.replace(backup, data_path)
                        backup = None
                    raise
            else:
                os.replace(tmp_model, out)
            return data_path if moved else None
        except OSError as exc:
            raise OutputError(f"{out}: cannot write: {exc.strerror or exc}") from None
        finally:
            for value, tensor in moved:
                value.const_value = tensor
            if backup is not None:
                Path(backup).unlink(missing_ok=True)
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)


def check_output_path(
    path: str | os.PathLike, input_files: Iterable[str | os.PathLike] = (), *, force: bool = False
) -> OutputPath:
    """Refuse an output path that cannot be written, or that is one of the files the input was read from.

    ``input_files``: the model file first, then its external data files. ``force`` allows overwriting
    the model file itself (a deliberate in-place conversion), never its external data. Returns the
    checked path, whose ``write_*`` methods do not check it again.
    """
    out = Path(path)
    files = [Path(f) for f in input_files]
    if files and not force and _same_file(out, files[0]):
        raise InputOverwriteError(f"{out}: the output would overwrite the input model")
    checked = OutputPath(out, tuple(files[:1]), force).with_external_data(files[1:])
    folder = checked.folder
    if not folder.exists():
        raise OutputError(f"{out}: the output folder {folder} does not exist")
    if not folder.is_dir():
        raise OutputError(f"{out}: the output folder {folder} is not a directory")
    if out.is_dir():
        raise OutputError(f"{out}: is a directory")
    if out.exists() and not out.is_file():
        raise OutputError(f"{out}: exists and is not a regular file")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputError(f"{out}: the output folder {folder} is not writable")
    return checked


def save_model(model: onnx.ModelProto, path: str | os.PathLike, input_path: str | os.PathLike | None = None) -> None:
    """Write ``model`` to ``path`` atomically (:meth:`OutputPath.write_model`); refuse to overwrite ``input_path``."""
    check_output_path(path, [input_path] if input_path is not None else []).write_model(model)


def save_ir_model(
    model: ir.Model,
    path: str | os.PathLike,
    to_proto: Callable[[ir.Model], onnx.ModelProto],
    *,
    input_files: Iterable[str | os.PathLike] = (),
    force: bool = False,
    min_bytes: int = 1024,
) -> Path | None:
    """Write an IR model with its large initializers in ``<path>.data`` (:meth:`OutputPath.write_ir_model`).

    Refuses to overwrite the input (``input_files``: the model file, then its external data files;
    ``force`` allows the model file itself). Returns the data file, or None when none was needed.
    """
    return check_output_path(path, input_files, force=force).write_ir_model(model, to_proto, min_bytes=min_bytes)


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and (a.resolve() == b.resolve() or os.path.samefile(a, b))
    except OSError:
        return False


def _new_file_mode(out: Path) -> int:
    try:
        return stat.S_IMODE(out.stat().st_mode)  # replacing a file: keep its permissions
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask
