"""Reading and writing model files safely, with errors a user can act on.

A model file is untrusted input (people convert files they downloaded), so loading is defensive:

- every failure (missing, empty, not a regular file, over protobuf's 2 GiB limit, not protobuf,
  truncated, nested deeper than protobuf parses, invalid graph) becomes a :class:`ModelLoadError`
  with one line that names the problem;
- external data is read by this module, never by onnx: each ``location`` is validated first (relative,
  no ``..``, no absolute or drive path, and after resolving symlinks still inside the model's folder),
  the file must be a regular file holding at least the bytes the tensor declares, and only then is it
  read. A location that escapes the model's folder is refused without opening anything;
- the graph's structure is checked before onnx's checker so that the common faults get a precise
  message: a cycle, a node reading a tensor nothing defines, a tensor produced twice, a graph output
  listed twice, an opset or IR version the installed onnx does not know.

Saving writes to a temporary file in the destination folder and renames it into place, so a failed
conversion never leaves a partial output (an existing file at the output path stays as it was); it
refuses to overwrite the input model or its external data files.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path, PurePosixPath, PureWindowsPath

import numpy as np
import onnx
import onnx.defs
import onnx_ir as ir
from google.protobuf.descriptor import FieldDescriptor as _FD
from google.protobuf.message import DecodeError, EncodeError

from amp_compiler import native_checks
from amp_compiler.errors import ModelLoadError, OutputError

#: Protobuf cannot serialize or parse one message of 2 GiB or more.
PROTOBUF_LIMIT = 2**31 - 1

_DOMAIN_ALIASES = {"ai.onnx": ""}
_ELEMENT_BYTES = {
    onnx.TensorProto.FLOAT: 4, onnx.TensorProto.UINT8: 1, onnx.TensorProto.INT8: 1,
    onnx.TensorProto.UINT16: 2, onnx.TensorProto.INT16: 2, onnx.TensorProto.INT32: 4,
    onnx.TensorProto.INT64: 8, onnx.TensorProto.BOOL: 1, onnx.TensorProto.FLOAT16: 2,
    onnx.TensorProto.DOUBLE: 8, onnx.TensorProto.UINT32: 4, onnx.TensorProto.UINT64: 8,
    onnx.TensorProto.COMPLEX64: 8, onnx.TensorProto.COMPLEX128: 16, onnx.TensorProto.BFLOAT16: 2,
    onnx.TensorProto.FLOAT8E4M3FN: 1, onnx.TensorProto.FLOAT8E4M3FNUZ: 1,
    onnx.TensorProto.FLOAT8E5M2: 1, onnx.TensorProto.FLOAT8E5M2FNUZ: 1,
}


# --------------------------------------------------------------------------------------------- text


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("==>"):
            return line[:300]
    return type(exc).__name__


def _q(name: str, limit: int = 80) -> str:
    """A name quoted for a one-line message: control characters escaped, long names shortened."""
    text = repr(name)
    return text if len(text) <= limit else f"{text[: limit - 4]}...{text[-1]}"


def _node_label(node: onnx.NodeProto, index: int) -> str:
    return f"node {_q(node.name)} ({node.op_type})" if node.name else f"unnamed {node.op_type} node #{index}"


# ------------------------------------------------------------------------------------------- graphs


iter_proto_graphs = native_checks.iter_proto_graphs  # defined there: the child process uses it too


def _subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    for attr in node.attribute:
        if attr.HasField("g"):
            yield attr.g
        yield from attr.graphs


def _model_graphs(model: onnx.ModelProto) -> Iterator[onnx.GraphProto]:
    """Every graph of the model: the main graph, training graphs, and their subgraphs."""
    if model.HasField("graph"):
        yield from iter_proto_graphs(model.graph)
    for info in model.training_info:
        for g in (info.initialization, info.algorithm):
            yield from iter_proto_graphs(g)


def _attribute_tensors(nodes: Iterable[onnx.NodeProto]) -> Iterator[onnx.TensorProto]:
    for node in nodes:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("sparse_tensor"):
                yield attr.sparse_tensor.values
                yield attr.sparse_tensor.indices
            for sparse in attr.sparse_tensors:
                yield sparse.values
                yield sparse.indices


def iter_model_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Every TensorProto that can hold data: initializers (dense and sparse) and tensor attributes,
    in every graph, subgraph and function body."""
    for tensor, _ in _tagged_tensors(model):
        yield tensor


def _tagged_tensors(model: onnx.ModelProto) -> Iterator[tuple[onnx.TensorProto, bool]]:
    """:func:`iter_model_tensors` in the same order, each with True for the dense initializers of the
    main graph and its subgraphs (the tensors deferred loading may leave on disk)."""
    def graph_tensors(g: onnx.GraphProto, in_main: bool) -> Iterator[tuple[onnx.TensorProto, bool]]:
        for tensor in g.initializer:
            yield tensor, in_main
        for sparse in g.sparse_initializer:
            yield sparse.values, False
            yield sparse.indices, False
        for tensor in _attribute_tensors(g.node):
            yield tensor, False

    if model.HasField("graph"):  # the graphs of _model_graphs, in its order
        for g in iter_proto_graphs(model.graph):
            yield from graph_tensors(g, True)
    for info in model.training_info:
        for top in (info.initialization, info.algorithm):
            for g in iter_proto_graphs(top):
                yield from graph_tensors(g, False)
    for fn in model.functions:
        for tensor in _attribute_tensors(fn.node):
            yield tensor, False
        for node in fn.node:
            for sub in _subgraphs(node):
                for g in iter_proto_graphs(sub):
                    for tensor in g.initializer:
                        yield tensor, False
                    for tensor in _attribute_tensors(g.node):
                        yield tensor, False


# -------------------------------------------------------------------------------------------- load


def load_model(path: str | os.PathLike) -> onnx.ModelProto:
    """Load and validate an ONNX model file (external data is read, after validation, from beside it)."""
    return load_model_and_files(path)[0]


def load_model_and_files(path: str | os.PathLike) -> tuple[onnx.ModelProto, list[Path]]:
    """Like :func:`load_model`, also returning every file read: the model, then its external data files."""
    p = Path(path)
    model, may_refer_to_files = _parse_model_file(p)
    files = [p, *(load_external_data(model, p.parent, origin=str(p)) if may_refer_to_files else [])]
    check_model_valid(model, origin=str(p))
    return model, files


@dataclasses.dataclass
class DeferredModel:
    """A model whose large initializers stay in their external data files until they are needed.

    ``model`` holds every other tensor; each deferred initializer keeps its ``external_data``
    reference, whose location was validated like :func:`load_external_data`'s (inside the model's
    folder, a regular file holding the bytes declared). ``locations`` maps each deferred tensor's
    location to that validated file; ``files`` lists the model file, then its external data files.
    """

    model: onnx.ModelProto
    files: list[Path]
    locations: dict[str, Path]
    checked: bool = True  # validated as check_model_valid validates (load_model_deferred(check=True))

    @property
    def deferred(self) -> bool:
        return bool(self.locations)

    def load(self) -> onnx.ModelProto:
        """Read the deferred tensors into ``model`` (all weights in memory, as :func:`load_model`)."""
        if self.locations:
            _read_external(_external_plan(self.model, self.files[0].parent, str(self.files[0]))[0], str(self.files[0]))
            self.locations = {}
        return self.model


#: Deferred loading leaves initializers of at least this many bytes on disk; smaller external
#: tensors (shapes, scales: what shape inference reads) are read into the model.
DEFER_MIN_BYTES = 64 * 1024


def load_model_deferred(
    path: str | os.PathLike, min_bytes: int = DEFER_MIN_BYTES, *, check: bool = True
) -> DeferredModel:
    """Load and validate a model file, leaving its large external-data initializers on disk.

    Every external data location is validated as :func:`load_model` validates it, and the model is
    checked as :func:`check_model_valid` checks it; only the bytes of initializers of ``min_bytes``
    or more are not read (:class:`DeferredTensor` reads them, one at a time, when needed). A model
    without external data is loaded whole. ``check=False`` leaves the model checks to the caller
    (``DeferredModel.checked`` is False): :func:`amp_compiler.convert.convert` does them while it
    builds the IR.
    """
    p = Path(path)
    model, may_refer_to_files = _parse_model_file(p)
    pending, sizes = _external_plan(model, p.parent, str(p)) if may_refer_to_files else ([], {})
    read = [entry for entry in pending if not (entry[4] and entry[3] >= min_bytes)]
    _read_external(read, str(p))
    locations = {
        _external_fields(tensor, str(p))[0]: target
        for tensor, target, _, length, initializer in pending
        if initializer and length >= min_bytes
    }
    if check:
        check_model_valid(model, origin=str(p), deferred=bool(locations))
    return DeferredModel(model, [p, *sizes], locations, checked=check)


def _parse_model_file(p: Path) -> tuple[onnx.ModelProto, bool]:
    """The parsed model, and whether it may refer to external data files. Every external tensor
    names its "location": a file without the word has none, and its external-data walk is skipped
    (a tensor marked external without a location is then refused by the model checks)."""
    data = _read_model_bytes(p)
    may_refer_to_files = b"location" in data
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except DecodeError as exc:
        detail = _first_line(exc)
        if "depth" in detail.lower() or "recursion" in detail.lower():
            raise ModelLoadError(
                f"{p}: nests messages deeper than protobuf can parse (subgraphs inside subgraphs, "
                f"about 30 levels at most): {detail}"
            ) from None
        raise ModelLoadError(f"{p}: not an ONNX model or truncated (protobuf parse failed: {detail})") from None
    except (RuntimeError, ValueError) as exc:
        raise ModelLoadError(f"{p}: not an ONNX model (protobuf parse failed: {_first_line(exc)})") from None
    del data
    if not model.HasField("graph") or (not model.graph.node and not model.graph.output):
        raise ModelLoadError(f"{p}: parses as protobuf but holds no ONNX graph (is it an ONNX model file?)")
    if not model.opset_import:
        raise ModelLoadError(f"{p}: the model imports no opset")
    return model, may_refer_to_files


def _read_model_bytes(p: Path) -> bytes:
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
        with open(p, "rb") as f:
            return f.read()
    except OSError as exc:
        raise ModelLoadError(f"{p}: cannot read: {exc.strerror or exc}") from None


# ------------------------------------------------------------------------------------ external data


def _external_fields(tensor: onnx.TensorProto, origin: str) -> tuple[str, int, int | None]:
    fields: dict[str, str] = {}
    for entry in tensor.external_data:
        fields[entry.key] = entry.value
    where = f"{origin}: tensor {_q(tensor.name)}"

    def number(key: str) -> int | None:
        if key not in fields:
            return None
        try:
            value = int(fields[key])
        except ValueError:
            raise ModelLoadError(f"{where}: external data {key} {_q(fields[key])} is not a number") from None
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
        raise ModelLoadError(f"{where}: external data location {_q(location)} contains a NUL character")
    posix, windows = PurePosixPath(location), PureWindowsPath(location)
    if posix.is_absolute() or windows.is_absolute() or windows.drive or location.startswith(("/", "\\")):
        raise ModelLoadError(
            f"{where}: external data location {_q(location)} is an absolute path; refused "
            "(external data must lie in the model's folder)"
        )
    if ".." in posix.parts or ".." in windows.parts:
        raise ModelLoadError(
            f"{where}: external data location {_q(location)} escapes the model's folder ('..'); refused"
        )
    root = Path(os.path.realpath(base))
    target = Path(os.path.realpath(root / location))
    if target != root and root not in target.parents:
        raise ModelLoadError(
            f"{where}: external data location {_q(location)} resolves (through a symlink) outside the "
            "model's folder; refused"
        )
    return target


def _expected_bytes(tensor: onnx.TensorProto) -> int | None:
    size = _ELEMENT_BYTES.get(tensor.data_type)
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
    pending, sizes = _external_plan(model, base, origin)
    _read_external(pending, origin)
    return list(sizes)


def _external_plan(
    model: onnx.ModelProto, base: str | os.PathLike, origin: str
) -> tuple[list[tuple[onnx.TensorProto, Path, int, int, bool]], dict[Path, int]]:
    """Validate every external tensor's location and size without reading a byte: per tensor
    (tensor, file, offset, length, is a dense initializer of the main graph or a subgraph), and the
    size of each file."""
    base = Path(base)
    pending: list[tuple[onnx.TensorProto, Path, int, int, bool]] = []
    sizes: dict[Path, int] = {}
    for tensor, initializer in _tagged_tensors(model):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        where = f"{origin}: tensor {_q(tensor.name)}"
        location, offset, length = _external_fields(tensor, origin)
        target = _resolve_location(location, base, where)
        if target not in sizes:
            try:
                st = target.stat()
            except FileNotFoundError:
                raise ModelLoadError(f"{where}: its external data file {_q(location)} is missing") from None
            except OSError as exc:
                raise ModelLoadError(
                    f"{where}: cannot read its external data file {_q(location)}: {exc.strerror or exc}"
                ) from None
            if not stat.S_ISREG(st.st_mode):
                raise ModelLoadError(f"{where}: external data location {_q(location)} is not a regular file")
            sizes[target] = st.st_size
        available = max(sizes[target] - offset, 0)
        expected = _expected_bytes(tensor)
        if length is None:
            length = expected if expected is not None else available
        if offset + length > sizes[target]:
            raise ModelLoadError(
                f"{where}: its external data file {_q(location)} is shorter than declared "
                f"({sizes[target]} bytes; the tensor needs bytes {offset} to {offset + length})"
            )
        if expected is not None and length != expected:
            raise ModelLoadError(
                f"{where}: external data length {length} does not match its shape "
                f"{list(tensor.dims)} ({expected} bytes)"
            )
        pending.append((tensor, target, offset, length, initializer and expected is not None))
    return pending, sizes


def _read_external(pending: Iterable[tuple], origin: str) -> None:
    """Read validated external tensors (from :func:`_external_plan`) into the model."""
    handles: dict[Path, object] = {}
    try:
        for tensor, target, offset, length, *_ in pending:
            f = handles.get(target)
            if f is None:
                f = handles[target] = open(target, "rb")
            f.seek(offset)
            data = f.read(length)
            if len(data) != length:  # the file shrank since it was checked
                raise ModelLoadError(f"{origin}: tensor {_q(tensor.name)}: external data file is shorter than declared")
            tensor.raw_data = data
            tensor.data_location = onnx.TensorProto.DEFAULT
            del tensor.external_data[:]
    except OSError as exc:
        raise ModelLoadError(f"{origin}: cannot read external data: {exc.strerror or exc}") from None
    finally:
        for f in handles.values():
            f.close()


# ------------------------------------------------------------------------------------------ checks


@functools.cache
def _known_opsets() -> dict[str, int]:
    try:
        versions = onnx.defs.C.schema_version_map()
    except AttributeError:  # not exposed by this onnx build: the default domain is what matters most
        return {"": onnx.defs.onnx_opset_version()}
    return {domain: high for domain, (_, high) in versions.items()}


def _check_versions(model: onnx.ModelProto, origin: str) -> None:
    if model.ir_version > onnx.IR_VERSION:
        raise ModelLoadError(
            f"{origin}: IR version {model.ir_version} is newer than the installed onnx {onnx.__version__} "
            f"knows (up to {onnx.IR_VERSION})"
        )
    known = _known_opsets()
    seen: set[str] = set()
    for imp in model.opset_import:
        domain = _DOMAIN_ALIASES.get(imp.domain, imp.domain)
        label = imp.domain or "ai.onnx"
        if domain in seen:
            raise ModelLoadError(f"{origin}: the model imports domain {_q(label)} twice")
        seen.add(domain)
        if imp.version < 1:
            raise ModelLoadError(f"{origin}: opset version {imp.version} of domain {_q(label)} is not valid")
        if domain in known and imp.version > known[domain]:
            raise ModelLoadError(
                f"{origin}: the model uses opset {imp.version} of {label}, which the installed onnx "
                f"{onnx.__version__} does not know (it knows up to {known[domain]}); upgrade onnx or "
                "export the model with an older opset"
            )


def _used_names(node: onnx.NodeProto) -> Iterator[str]:
    """Every tensor name a node reads, including those its subgraphs read from outer scopes."""
    yield from (n for n in node.input if n)
    for sub in _subgraphs(node):
        for g in iter_proto_graphs(sub):
            for inner in g.node:
                yield from (n for n in inner.input if n)
            for out in g.output:
                yield out.name


def _check_graph_structure(graph: onnx.GraphProto, outer: frozenset[str], origin: str) -> None:
    """Precise messages for the faults onnx's checker reports tersely (cycles, undefined tensors)."""
    where = f"{origin}: invalid ONNX model" + (f" (in subgraph {_q(graph.name)})" if outer else "")
    defined: set[str] = set()
    for v in graph.input:
        defined.add(v.name)
    for t in graph.initializer:
        defined.add(t.name)
    for s in graph.sparse_initializer:
        defined.add(s.values.name)
    producer: dict[str, int] = {}
    for i, node in enumerate(graph.node):
        for name in node.output:
            if not name:
                continue
            if name in producer or name in defined:
                first = (
                    _node_label(graph.node[producer[name]], producer[name])
                    if name in producer
                    else "a graph input or initializer"
                )
                raise ModelLoadError(
                    f"{where}: tensor {_q(name)} is produced twice ({first} and {_node_label(node, i)}); "
                    "every tensor name must have one producer"
                )
            producer[name] = i
    _check_output_names(graph, origin, subgraph=bool(outer))
    for v in graph.output:
        if v.name not in producer and v.name not in defined and v.name not in outer:
            raise ModelLoadError(f"{where}: graph output {_q(v.name)} is not produced by any node")
    visible = defined | outer
    unsorted = False
    position = producer.get
    for i, node in enumerate(graph.node):
        for name in node.input:
            if not name:
                continue
            j = position(name)
            if j is None:
                if name not in visible:
                    raise ModelLoadError(
                        f"{where}: {_node_label(node, i)} reads tensor {_q(name)}, which no node, graph input "
                        "or initializer defines"
                    )
            elif j >= i:
                unsorted = True
        if node.attribute and not unsorted and any(True for _ in _subgraphs(node)):
            unsorted = any(position(n, -1) >= i for n in _used_names(node))
    if unsorted:
        # The dependencies (node -> producers of what it reads, in its subgraphs too) only to name the fault.
        deps = [{producer[n] for n in _used_names(node) if n in producer} for node in graph.node]
        cycle = _find_cycle(deps)
        if cycle is not None:
            path = " -> ".join(_node_label(graph.node[j], j) for j in cycle[:6])
            more = " -> ..." if len(cycle) > 6 else ""
            raise ModelLoadError(f"{where}: the graph has a cycle: {path}{more} -> back to the first")
        raise ModelLoadError(
            f"{where}: nodes are not in topological order (ONNX requires every node to come after the "
            "producers of its inputs)"
        )
    scope = frozenset(visible | set(producer))
    for node in graph.node:
        for sub in _subgraphs(node):
            _check_graph_structure(sub, scope, origin)


def _find_cycle(deps: list[set[int]]) -> list[int] | None:
    """One cycle of the dependency graph (node -> nodes it reads from), or None. Iterative DFS."""
    state = [0] * len(deps)  # 0 unseen, 1 on the stack, 2 done
    for start in range(len(deps)):
        if state[start]:
            continue
        stack = [(start, iter(sorted(deps[start])))]
        path = [start]
        state[start] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                stack.pop()
                path.pop()
                state[node] = 2
            elif state[nxt] == 1:
                cycle = path[path.index(nxt):]
                return list(reversed(cycle))  # in data-flow order
            elif state[nxt] == 0:
                state[nxt] = 1
                path.append(nxt)
                stack.append((nxt, iter(sorted(deps[nxt]))))
    return None


def _find_bad_string(msg, path: tuple) -> tuple | None:
    """The field path of the first string that is not valid UTF-8 (protobuf's Python runtime hands
    such proto2 strings back as ``bytes``), or None. Tensor payloads are not visited (not copied)."""
    if isinstance(msg, onnx.TensorProto):
        fields = [(f, getattr(msg, f.name)) for f in _TENSOR_TEXT_FIELDS]
    else:
        fields = msg.ListFields()
    for field, value in fields:
        if field.type == _FD.TYPE_MESSAGE:
            plain_nodes = field.message_type is _NODE_DESCRIPTOR
            for k, item in enumerate(value) if field.is_repeated else ((None, value),):
                if plain_nodes and _plain_node_is_clean(item):
                    continue
                found = _find_bad_string(item, (path, field.name, k))
                if found is not None:
                    return found
        elif field.type == _FD.TYPE_STRING:
            for k, item in enumerate(value) if field.is_repeated else ((None, value),):
                if isinstance(item, bytes):
                    return (path, field.name, k)
    return None


_NODE_DESCRIPTOR = onnx.NodeProto.DESCRIPTOR


def _fields(descriptor, kind: int, repeated: bool) -> tuple[str, ...]:
    return tuple(f.name for f in descriptor.fields if f.type == kind and f.is_repeated == repeated)


_NODE_TEXT = _fields(_NODE_DESCRIPTOR, _FD.TYPE_STRING, False)
_NODE_TEXT_LISTS = _fields(_NODE_DESCRIPTOR, _FD.TYPE_STRING, True)
_NODE_MESSAGE_LISTS = tuple(n for n in _fields(_NODE_DESCRIPTOR, _FD.TYPE_MESSAGE, True) if n != "attribute")
_ATTR_TEXT = _fields(onnx.AttributeProto.DESCRIPTOR, _FD.TYPE_STRING, False)
_ATTR_MESSAGES = _fields(onnx.AttributeProto.DESCRIPTOR, _FD.TYPE_MESSAGE, False)
_ATTR_MESSAGE_LISTS = _fields(onnx.AttributeProto.DESCRIPTOR, _FD.TYPE_MESSAGE, True)


def _plain_node_is_clean(node: onnx.NodeProto) -> bool:
    """A quick look at the common node (text fields and attributes without tensors or graphs): True
    when all its strings are valid UTF-8. False means "walk it field by field", never "bad"."""
    for name in _NODE_TEXT:
        if type(getattr(node, name)) is not str:
            return False
    for name in _NODE_TEXT_LISTS:
        for item in getattr(node, name):
            if type(item) is not str:
                return False
    for name in _NODE_MESSAGE_LISTS:
        if len(getattr(node, name)):
            return False
    for attr in node.attribute:
        for name in _ATTR_TEXT:
            if type(getattr(attr, name)) is not str:
                return False
        for name in _ATTR_MESSAGES:
            if attr.HasField(name):
                return False
        for name in _ATTR_MESSAGE_LISTS:
            if len(getattr(attr, name)):
                return False
    return True


def _path_text(path: tuple | None) -> str:
    parts = []
    while path:
        path, name, k = path
        parts.append(name if k is None else f"{name}[{k}]")
    return ".".join(reversed(parts))


_TENSOR_TEXT_FIELDS = [
    onnx.TensorProto.DESCRIPTOR.fields_by_name[n] for n in ("name", "doc_string", "external_data")
]


_KNOWN_DTYPES = frozenset(onnx.TensorProto.DataType.values()) - {onnx.TensorProto.UNDEFINED}
_TYPED_FIELD = {  # data_type -> (the repeated field holding its values, values per element)
    onnx.TensorProto.FLOAT: ("float_data", 1), onnx.TensorProto.COMPLEX64: ("float_data", 2),
    onnx.TensorProto.DOUBLE: ("double_data", 1), onnx.TensorProto.COMPLEX128: ("double_data", 2),
    onnx.TensorProto.INT64: ("int64_data", 1), onnx.TensorProto.UINT32: ("uint64_data", 1),
    onnx.TensorProto.UINT64: ("uint64_data", 1), onnx.TensorProto.STRING: ("string_data", 1),
    **{
        t: ("int32_data", 1)
        for t in (
            onnx.TensorProto.INT32, onnx.TensorProto.INT16, onnx.TensorProto.INT8, onnx.TensorProto.UINT16,
            onnx.TensorProto.UINT8, onnx.TensorProto.BOOL, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16,
            onnx.TensorProto.FLOAT8E4M3FN, onnx.TensorProto.FLOAT8E4M3FNUZ, onnx.TensorProto.FLOAT8E5M2,
            onnx.TensorProto.FLOAT8E5M2FNUZ,
        )
    },
}


@functools.cache
def _bit_width(data_type: int) -> int | None:
    import onnx_ir as ir

    try:
        return ir.DataType(data_type).bitwidth
    except (ValueError, TypeError, AttributeError):
        return None


def _check_tensor_data(tensor: onnx.TensorProto, where: str) -> None:
    """A tensor's stored values must match its element type and shape (onnx's checker does not look)."""

    def label() -> str:  # only built for an error: most models have tens of thousands of tensors
        return f"{where}: invalid ONNX model: tensor {_q(tensor.name)}"

    data_type = tensor.data_type
    if data_type not in _KNOWN_DTYPES:
        raise ModelLoadError(f"{label()} has unknown element type {data_type}")
    count = 1
    for d in tensor.dims:
        if d < 0:
            raise ModelLoadError(f"{label()} has a negative dimension in its shape {list(tensor.dims)}")
        count *= d
    if tensor.HasField("raw_data"):
        bits = _bit_width(data_type) if data_type != onnx.TensorProto.STRING else None
        if bits is None:
            raise ModelLoadError(f"{label()}: element type {data_type} cannot be stored as raw bytes")
        expected = (count * bits + 7) // 8
        stored = len(tensor.raw_data)
        if stored != expected:
            raise ModelLoadError(
                f"{label()} holds {stored} bytes but its shape {list(tensor.dims)} needs {expected}"
            )
        return
    field, per = _TYPED_FIELD.get(data_type, (None, 1))
    if field is None:  # sub-byte types packed in int32_data: not checked here
        return
    stored = len(getattr(tensor, field))
    if stored != count * per:
        raise ModelLoadError(f"{label()} holds {stored} values but its shape {list(tensor.dims)} needs {count * per}")


def _check_type(tp: onnx.TypeProto, where: str, name: str) -> None:
    kind = tp.WhichOneof("value")
    if kind in ("tensor_type", "sparse_tensor_type"):
        elem = getattr(tp, kind).elem_type
        if elem and elem not in _KNOWN_DTYPES:
            raise ModelLoadError(f"{where}: invalid ONNX model: {_q(name)} has unknown element type {elem}")
    elif kind == "sequence_type":
        _check_type(tp.sequence_type.elem_type, where, name)
    elif kind == "optional_type":
        _check_type(tp.optional_type.elem_type, where, name)
    elif kind == "map_type":
        if tp.map_type.key_type not in _KNOWN_DTYPES:
            raise ModelLoadError(f"{where}: invalid ONNX model: {_q(name)} has unknown key type {tp.map_type.key_type}")
        _check_type(tp.map_type.value_type, where, name)


def _check_values(model: onnx.ModelProto, origin: str, deferred: bool = False) -> None:
    for tensor in iter_model_tensors(model):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            if deferred:
                continue  # validated by load_model_deferred: location, file, and its length vs shape
            if not _external_fields(tensor, origin)[0]:
                raise ModelLoadError(f"{origin}: tensor {_q(tensor.name)}: stored as external data but names no location")
            raise ModelLoadError(
                f"{origin}: tensor {_q(tensor.name)} refers to external data that is not loaded; "
                "pass the model's file path instead, so its external data is validated and read"
            )
        _check_tensor_data(tensor, origin)
    for g in _model_graphs(model):
        for v in (*g.input, *g.output, *g.value_info):
            _check_type(v.type, origin, v.name)
    for fn in model.functions:
        for v in fn.value_info:
            _check_type(v.type, origin, v.name)


def check_model_valid(model: onnx.ModelProto, origin: str = "model", *, deferred: bool = False) -> None:
    """Check that a model is one we can convert; an invalid model is a user error (it is their input).

    :func:`check_model_contents`, then onnx's checker (:func:`checker_verdict`). ``deferred``:
    tensors still stored as external data were validated by :func:`load_model_deferred` and are
    accepted (onnx's checker, which would look for their files itself, sees them as empty tensors).
    """
    check_model_contents(model, origin, deferred=deferred)
    checker_verdict(model, origin, native_checks.check(checker_input(model, deferred)))


def check_model_contents(model: onnx.ModelProto, origin: str = "model", *, deferred: bool = False) -> None:
    """Everything :func:`check_model_valid` checks but onnx's checker: versions, text (UTF-8),
    tensor data against shapes and types, value types, and graph output names. ``deferred`` as there."""
    _check_versions(model, origin)
    bad = _find_bad_string(model, None)
    if bad is not None:
        raise ModelLoadError(f"{origin}: invalid ONNX model: the text at {_path_text(bad)} is not valid UTF-8")
    _check_values(model, origin, deferred)
    for g in _model_graphs(model):
        _check_output_names(g, origin, subgraph=g is not model.graph)


def checker_input(model: onnx.ModelProto, deferred: bool) -> onnx.ModelProto:
    """What onnx's checker is given for ``model``: deferred external tensors as empty tensors."""
    return _without_deferred_data(model) if deferred else model


def checker_verdict(model: onnx.ModelProto, origin: str, error: native_checks.CheckerError | None) -> None:
    """Raise for onnx's checker's complaint about ``model`` (None: it passed).

    The checker finds every structural fault (a cycle, an undefined or doubly produced tensor) but
    says tersely what; the graph is then examined to say precisely. A model the checker accepts is
    not walked again.
    """
    if error is None:
        return
    if not error.invalid:  # e.g. > 2 GB without external data
        raise ModelLoadError(f"{origin}: {error.message}")
    if model.HasField("graph"):
        _check_graph_structure(model.graph, frozenset(), origin)
    raise ModelLoadError(f"{origin}: invalid ONNX model: {error.message}")


def _check_output_names(graph: onnx.GraphProto, origin: str, subgraph: bool) -> None:
    seen: set[str] = set()
    for v in graph.output:
        if v.name in seen:
            where = f"{origin}: invalid ONNX model" + (f" (in subgraph {_q(graph.name)})" if subgraph else "")
            raise ModelLoadError(f"{where}: graph output {_q(v.name)} is listed twice; output names must be unique")
        seen.add(v.name)


def _without_deferred_data(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose external-data tensors are empty (``dims = [0]``) in-memory tensors."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for tensor in iter_model_tensors(copy):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            tensor.data_location = onnx.TensorProto.DEFAULT
            del tensor.external_data[:]
            del tensor.dims[:]
            tensor.dims.append(0)
    return copy


# -------------------------------------------------------------------------------------------- save


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and (a.resolve() == b.resolve() or os.path.samefile(a, b))
    except OSError:
        return False


def check_output_path(
    path: str | os.PathLike, input_files: Iterable[str | os.PathLike] = (), *, force: bool = False
) -> None:
    """Refuse an output path that cannot be written, or that is one of the files the input was read from.

    ``input_files``: the model file first, then its external data files. ``force`` allows overwriting
    the model file itself (a deliberate in-place conversion), never its external data.
    """
    out = Path(path)
    files = [Path(f) for f in input_files]
    for k, f in enumerate(files):
        if _same_file(out, f):
            if k == 0 and not force:
                raise OutputError(f"{out}: the output would overwrite the input model (use --force to allow)")
            if k > 0:
                raise OutputError(f"{out}: the output would overwrite the input model's external data; refused")
    folder = out.parent if str(out.parent) else Path(".")
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


def _new_file_mode(out: Path) -> int:
    try:
        return stat.S_IMODE(out.stat().st_mode)  # replacing a file: keep its permissions
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def save_model(model: onnx.ModelProto, path: str | os.PathLike, input_path: str | os.PathLike | None = None) -> None:
    """Write ``model`` to ``path`` atomically; refuse to overwrite ``input_path``.

    The bytes go to a temporary file in the destination folder, which is renamed over ``path`` only
    once complete: a failure at any point leaves ``path`` as it was and no temporary file behind.
    """
    out = Path(path)
    check_output_path(out, [input_path] if input_path is not None else [])
    folder = out.parent if str(out.parent) else Path(".")
    try:
        data = model.SerializeToString()
    except (ValueError, EncodeError) as exc:  # protobuf refuses messages of 2 GiB or more (upb: EncodeError)
        raise OutputError(f"{out}: cannot write the converted model: {_first_line(exc)}") from None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{out.name[:100]}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise OutputError(f"{out}: the output folder {folder} is not writable: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _new_file_mode(out))
        os.replace(tmp, out)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise OutputError(f"{out}: cannot write: {exc.strerror or exc}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# ------------------------------------------------------------------------- deferred tensors (IR side)

_COPY_CHUNK = 64 * 2**20
_PAGE = 4096  # offsets of tensors in a data file we write: page-aligned, so runtimes can map them


class DeferredTensor(ir.ExternalTensor):
    """An initializer :func:`load_model_deferred` left on disk, for the IR.

    Its bytes are read from the validated file each time they are asked for (plain reads, nothing
    memory-mapped or kept), so a pass that looks at every weight in turn holds one at a time.
    """

    __slots__ = ("_file",)

    def __init__(self, tensor: ir.ExternalTensor, file: Path):
        super().__init__(
            tensor.location, tensor.offset, tensor.length, tensor.dtype, shape=tensor.shape,
            name=tensor.name, doc_string=tensor.doc_string, metadata_props=dict(tensor.metadata_props),
            base_dir=file.parent,
        )
        self._file = file

    def _read(self, f, count: int) -> bytes:
        data = f.read(count)
        if len(data) != count:  # the file shrank since it was validated
            raise ModelLoadError(f"{self._file}: external data of tensor {_q(self.name)} is shorter than declared")
        return data

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

    def tofile(self, file) -> None:
        with open(self._file, "rb") as f:
            f.seek(self.offset or 0)
            left = self.length if self.length is not None else self.nbytes
            while left > 0:
                chunk = self._read(f, min(_COPY_CHUNK, left))
                file.write(chunk)
                left -= len(chunk)

    def release(self) -> None:
        super().release()


def defer_ir_tensors(model: ir.Model, locations: dict[str, Path]) -> int:
    """Bind the external initializers of an IR model built from a :class:`DeferredModel`'s proto to
    their validated files (:class:`DeferredTensor`). Returns how many were bound."""
    n = 0
    for graph in model.graphs():
        for value in graph.initializers.values():
            tensor = value.const_value
            if isinstance(tensor, ir.ExternalTensor) and not isinstance(tensor, DeferredTensor):
                file = locations.get(str(tensor.location))
                if file is None:
                    raise ModelLoadError(f"tensor {_q(value.name)}: external data that was not validated")
                value.const_value = DeferredTensor(tensor, file)
                n += 1
    return n


def save_ir_model(
    model: ir.Model,
    path: str | os.PathLike,
    to_proto,
    *,
    input_files: Iterable[str | os.PathLike] = (),
    force: bool = False,
    min_bytes: int = 1024,
) -> Path | None:
    """Write an IR model with its initializers of ``min_bytes`` or more in ``<path>.data`` beside it.

    Tensors are written one at a time (a tensor still on disk is copied in chunks), so writing holds
    no more memory than the model already does; the ModelProto (``to_proto(model)``, called while the
    initializers are references to the data file) stays small. Both files are written to temporary
    files and renamed into place, the data file first (an earlier one kept aside until the model file
    is in place), so a failure leaves the output as it was and no temporary file; ``model`` is left
    as it was. Refuses to overwrite the input (``input_files``: the model file, then
    its external data files; ``force`` allows the model file itself). Returns the data file, or None
    when no tensor was large enough to need one.
    """
    out = Path(path)
    files = [Path(f) for f in input_files]
    check_output_path(out, files, force=force)
    folder = out.parent if str(out.parent) else Path(".")
    data_path = folder / f"{out.name}.data"
    if any(_same_file(data_path, f) for f in files):
        raise OutputError(f"{out}: its data file {data_path.name} would overwrite the input model's files; refused")
    if data_path.exists() and not data_path.is_file():
        raise OutputError(f"{out}: its data file {data_path} exists and is not a regular file")
    moved: list[tuple[ir.Value, ir.TensorProtocol]] = []
    tmp_data = tmp_model = backup = None
    try:
        fd, tmp_data = tempfile.mkstemp(prefix=f".{data_path.name[:100]}.", suffix=".tmp", dir=folder)
        with os.fdopen(fd, "wb") as f:
            offset = 0
            for graph in model.graphs():
                for value in graph.initializers.values():
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
                        raise OutputError(f"{out}: tensor {_q(value.name)} wrote {f.tell() - offset} bytes, not {tensor.nbytes}")
                    moved.append((value, tensor))
                    value.const_value = ir.ExternalTensor(
                        data_path.name, offset, tensor.nbytes, tensor.dtype, shape=tensor.shape,
                        name=value.name, doc_string=tensor.doc_string,
                        metadata_props=dict(tensor.metadata_props), base_dir=folder,
                    )
                    offset += tensor.nbytes
            f.flush()
            os.fsync(f.fileno())
        proto = to_proto(model)
        try:
            data = proto.SerializeToString()
        except (ValueError, EncodeError) as exc:  # over 2 GiB even with the weights outside
            raise OutputError(f"{out}: cannot write the converted model: {_first_line(exc)}") from None
        fd, tmp_model = tempfile.mkstemp(prefix=f".{out.name[:100]}.", suffix=".tmp", dir=folder)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
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
        for tmp in (tmp_data, tmp_model, backup):
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)
