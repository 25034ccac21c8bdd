"""Reading and writing model files safely, with errors a user can act on.

- Loading turns every failure (missing, empty, not protobuf, truncated, invalid graph) into a
  :class:`ModelLoadError` with one line that names the problem.
- Saving writes to a temporary file in the destination folder and renames it into place, so a failed
  conversion never leaves a partial output; it refuses to overwrite the input.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from amp_compiler.errors import ModelLoadError, OutputError


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("==>"):
            return line[:300]
    return type(exc).__name__


def iter_proto_graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """A GraphProto and all its subgraphs (If/Loop/Scan bodies, ...), parents first."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from iter_proto_graphs(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from iter_proto_graphs(g)


def load_model(path: str | os.PathLike) -> onnx.ModelProto:
    """Load and validate an ONNX model file (external data is read from beside it)."""
    p = Path(path)
    if not p.exists():
        raise ModelLoadError(f"{p}: no such file")
    if p.is_dir():
        raise ModelLoadError(f"{p}: is a directory, not an ONNX model file")
    if p.stat().st_size == 0:
        raise ModelLoadError(f"{p}: the file is empty, not an ONNX model")
    try:
        model = onnx.load(str(p), load_external_data=False)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise ModelLoadError(
            f"{p}: not an ONNX model or truncated (protobuf parse failed: {_first_line(exc)})"
        ) from None
    except OSError as exc:
        raise ModelLoadError(f"{p}: cannot read: {exc.strerror or exc}") from None
    if not model.HasField("graph") or (not model.graph.node and not model.graph.output):
        raise ModelLoadError(f"{p}: parses as protobuf but holds no ONNX graph")
    if not model.opset_import:
        raise ModelLoadError(f"{p}: the model imports no opset")
    try:
        onnx.load_external_data_for_model(model, str(p.parent))
    except (OSError, ValueError, RuntimeError) as exc:
        raise ModelLoadError(f"{p}: cannot load its external data: {_first_line(exc)}") from None
    check_model_valid(model, origin=str(p))
    return model


def check_model_valid(model: onnx.ModelProto, origin: str = "model") -> None:
    """Run onnx's checker; an invalid model is a user error (it is their input)."""
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        raise ModelLoadError(f"{origin}: invalid ONNX model: {_first_line(exc)}") from None
    except ValueError as exc:  # e.g. > 2 GB without external data
        raise ModelLoadError(f"{origin}: {_first_line(exc)}") from None


def save_model(model: onnx.ModelProto, path: str | os.PathLike, input_path: str | os.PathLike | None = None) -> None:
    """Write ``model`` to ``path`` atomically; refuse to overwrite ``input_path``."""
    out = Path(path)
    if input_path is not None and out.exists() and out.resolve() == Path(input_path).resolve():
        raise OutputError(f"{out}: refusing to overwrite the input model; choose another output path")
    folder = out.parent if str(out.parent) else Path(".")
    if not folder.is_dir():
        raise OutputError(f"{out}: the output folder {folder} does not exist")
    if out.is_dir():
        raise OutputError(f"{out}: is a directory")
    if not os.access(folder, os.W_OK):
        raise OutputError(f"{out}: the output folder {folder} is not writable")
    data = model.SerializeToString()
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, out)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise OutputError(f"{out}: cannot write: {exc.strerror or exc}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
