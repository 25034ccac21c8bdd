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

import functools
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path, PurePosixPath, PureWindowsPath

import onnx
import onnx.defs
from google.protobuf.descriptor import FieldDescriptor as _FD
from google.protobuf.message import DecodeError

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


_GRAPH, _GRAPHS = onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS


def iter_proto_graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """A GraphProto and all its subgraphs (If/Loop/Scan bodies, ...), parents first."""
    yield graph
    for node in graph.node:
        attrs = node.attribute
        if not attrs:
            continue
        for attr in attrs:
            kind = attr.type
            if kind == _GRAPH:
                yield from iter_proto_graphs(attr.g)
            elif kind == _GRAPHS:
                for g in attr.graphs:
                    yield from iter_proto_graphs(g)


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
    for g in _model_graphs(model):
        yield from g.initializer
        for sparse in g.sparse_initializer:
            yield sparse.values
            yield sparse.indices
        yield from _attribute_tensors(g.node)
    for fn in model.functions:
        yield from _attribute_tensors(fn.node)
        for node in fn.node:
            for sub in _subgraphs(node):
                for g in iter_proto_graphs(sub):
                    yield from g.initializer
                    yield from _attribute_tensors(g.node)


# -------------------------------------------------------------------------------------------- load


def load_model(path: str | os.PathLike) -> onnx.ModelProto:
    """Load and validate an ONNX model file (external data is read, after validation, from beside it)."""
    return load_model_and_files(path)[0]


def load_model_and_files(path: str | os.PathLike) -> tuple[onnx.ModelProto, list[Path]]:
    """Like :func:`load_model`, also returning every file read: the model, then its external data files."""
    p = Path(path)
    data = _read_model_bytes(p)
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
    files = [p, *load_external_data(model, p.parent, origin=str(p))]
    check_model_valid(model, origin=str(p))
    return model, files


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
    base = Path(base)
    pending: list[tuple[onnx.TensorProto, Path, int, int]] = []
    sizes: dict[Path, int] = {}
    for tensor in iter_model_tensors(model):
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
        pending.append((tensor, target, offset, length))
    handles: dict[Path, object] = {}
    try:
        for tensor, target, offset, length in pending:
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
    return list(sizes)


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
    seen_outputs: set[str] = set()
    for v in graph.output:
        if v.name in seen_outputs:
            raise ModelLoadError(f"{where}: graph output {_q(v.name)} is listed twice; output names must be unique")
        seen_outputs.add(v.name)
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


def _check_values(model: onnx.ModelProto, origin: str) -> None:
    for tensor in iter_model_tensors(model):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
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


def check_model_valid(model: onnx.ModelProto, origin: str = "model") -> None:
    """Check that a model is one we can convert; an invalid model is a user error (it is their input).

    Structure first (versions, cycles, undefined or doubly produced tensors, external data left
    unloaded), then onnx's checker.
    """
    _check_versions(model, origin)
    bad = _find_bad_string(model, None)
    if bad is not None:
        raise ModelLoadError(f"{origin}: invalid ONNX model: the text at {_path_text(bad)} is not valid UTF-8")
    _check_values(model, origin)
    if model.HasField("graph"):
        _check_graph_structure(model.graph, frozenset(), origin)
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        raise ModelLoadError(f"{origin}: invalid ONNX model: {_first_line(exc)}") from None
    except ValueError as exc:  # e.g. > 2 GB without external data
        raise ModelLoadError(f"{origin}: {_first_line(exc)}") from None


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
    except ValueError as exc:  # protobuf refuses messages of 2 GiB or more
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
