"""Is this a model we can convert? Versions, text, tensor data and types, then onnx's checker verdict.

An invalid model is a user error (it is their input): every fault becomes a :class:`ModelLoadError`
with one line that names it. The cheap checks here run first; onnx's checker (C++, run by
:mod:`amp_compiler.onnx.load.native_checks`, in a child process for large models) then has the last word,
and when it refuses a model :mod:`amp_compiler.onnx.load.structure` says precisely what is wrong.
"""

from __future__ import annotations

import functools

import onnx
import onnx.defs
import onnx_ir as ir
from google.protobuf.descriptor import FieldDescriptor as _FD
from google.protobuf.message import Message

from amp_compiler.errors import ModelLoadError
from amp_compiler.onnx.load import native_checks
from amp_compiler.onnx.load.external_data import external_fields
from amp_compiler.onnx.load.foreign_ops import ForeignOps, check_against_onnxruntime, for_onnx_checker, foreign_ops
from amp_compiler.onnx.load.proto_walk import iter_model_tensors, model_graphs
from amp_compiler.onnx.load.structure import check_graph_structure, check_output_names
from amp_compiler.onnx.load.text import quote
from amp_compiler.policy.schemas import is_onnx_domain

__all__ = ["check_model_contents", "check_model_valid", "checker_input", "checker_verdict"]


def check_model_valid(model: onnx.ModelProto, origin: str = "model", *, deferred: bool = False) -> None:
    """Check that a model is one we can convert; an invalid model is a user error (it is their input).

    :func:`check_model_contents`, then onnx's checker (:func:`checker_verdict`). ``deferred``:
    tensors still stored as external data were validated by :func:`load_model_deferred` and are
    accepted (onnx's checker, which would look for their files itself, sees them as empty tensors).
    """
    found = foreign_ops(model)
    check_model_contents(model, origin, deferred=deferred, found=found)
    checker_verdict(model, origin, native_checks.check(checker_input(model, deferred, found)))


def check_model_contents(
    model: onnx.ModelProto, origin: str = "model", *, deferred: bool = False, found: ForeignOps | None = None
) -> None:
    """Everything :func:`check_model_valid` checks but onnx's checker: versions, text (UTF-8),
    tensor data against shapes and types, value types, graph output names, and the ops onnx does
    not define against onnxruntime's schemas (:mod:`amp_compiler.onnx.load.foreign_ops`; ``found``: those
    ops, when the caller has them already). ``deferred`` as there."""
    _check_versions(model, origin)
    bad = _find_bad_string(model, None)
    if bad is not None:
        raise ModelLoadError(f"{origin}: invalid ONNX model: the text at {_path_text(bad)} is not valid UTF-8")
    _check_values(model, origin, deferred)
    for g in model_graphs(model):
        check_output_names(g, origin, subgraph=g is not model.graph)
    check_against_onnxruntime(foreign_ops(model) if found is None else found, origin)


def checker_input(model: onnx.ModelProto, deferred: bool, found: ForeignOps | None = None) -> onnx.ModelProto:
    """What onnx's checker is given for ``model``: deferred external tensors as empty tensors, and
    the ops onnxruntime registers in onnx's domains moved out of them (onnx's checker would refuse
    them for want of a schema; :func:`check_model_contents` checks them against onnxruntime's).
    ``found``: :func:`~amp_compiler.onnx.load.foreign_ops.foreign_ops` of ``model``, when known."""
    found = foreign_ops(model) if found is None else found
    return for_onnx_checker(_without_deferred_data(model) if deferred else model, found)


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
        check_graph_structure(model.graph, frozenset(), origin)
    raise ModelLoadError(f"{origin}: invalid ONNX model: {error.message}")


# ------------------------------------------------------------------------------------ the checks


@functools.cache
def _known_opsets() -> dict[str, int]:
    try:
        versions = onnx.defs.C.schema_version_map()
    except AttributeError:  # not exposed by this onnx build: the default domain is what matters most
        return {"": onnx.defs.onnx_opset_version()}
    return {domain: high for domain, (_, high) in versions.items()}


def _check_versions(model: onnx.ModelProto, origin: str) -> None:
    """The IR version and every opset import must be ones the installed onnx knows, each domain at
    one version (an import repeated at the same version is accepted, as onnx's checker does)."""
    if model.ir_version > onnx.IR_VERSION:
        raise ModelLoadError(
            f"{origin}: IR version {model.ir_version} is newer than the installed onnx {onnx.__version__} "
            f"knows (up to {onnx.IR_VERSION})"
        )
    known = _known_opsets()
    seen: dict[str, int] = {}
    for imp in model.opset_import:
        domain = "" if is_onnx_domain(imp.domain) else imp.domain
        label = imp.domain or "ai.onnx"
        if domain in seen:
            # the same import twice (skl2onnx 1.20 writes ('', 22) twice for tree models): onnx's
            # checker and onnxruntime accept it, and the IR keeps one; two versions are a conflict
            if seen[domain] != imp.version:
                raise ModelLoadError(
                    f"{origin}: the model imports domain {quote(label)} twice, at opsets {seen[domain]} and "
                    f"{imp.version}; keep one"
                )
            continue
        seen[domain] = imp.version
        if imp.version < 1:
            raise ModelLoadError(f"{origin}: opset version {imp.version} of domain {quote(label)} is not valid")
        if domain in known and imp.version > known[domain]:
            raise ModelLoadError(
                f"{origin}: the model uses opset {imp.version} of {label}, which the installed onnx "
                f"{onnx.__version__} does not know (it knows up to {known[domain]}); upgrade onnx or "
                "export the model with an older opset"
            )


def _find_bad_string(msg: Message, path: tuple | None) -> tuple | None:
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
_TYPED_FIELD: dict[int, tuple[str, int]] = {  # data_type -> (the repeated field holding its values, values per element)
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
    try:
        return ir.DataType(data_type).bitwidth
    except (ValueError, TypeError, AttributeError):
        return None


def _check_tensor_data(tensor: onnx.TensorProto, where: str) -> None:
    """A tensor's stored values must match its element type and shape (onnx's checker does not look)."""

    def label() -> str:  # only built for an error: most models have tens of thousands of tensors
        return f"{where}: invalid ONNX model: tensor {quote(tensor.name)}"

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
            raise ModelLoadError(f"{where}: invalid ONNX model: {quote(name)} has unknown element type {elem}")
    elif kind == "sequence_type":
        _check_type(tp.sequence_type.elem_type, where, name)
    elif kind == "optional_type":
        _check_type(tp.optional_type.elem_type, where, name)
    elif kind == "map_type":
        if tp.map_type.key_type not in _KNOWN_DTYPES:
            key_type = tp.map_type.key_type
            raise ModelLoadError(f"{where}: invalid ONNX model: {quote(name)} has unknown key type {key_type}")
        _check_type(tp.map_type.value_type, where, name)


def _check_values(model: onnx.ModelProto, origin: str, deferred: bool = False) -> None:
    for tensor in iter_model_tensors(model):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            if deferred:
                continue  # validated by load_model_deferred: location, file, and its length vs shape
            if not external_fields(tensor, origin)[0]:
                raise ModelLoadError(
                    f"{origin}: tensor {quote(tensor.name)}: stored as external data but names no location"
                )
            raise ModelLoadError(
                f"{origin}: tensor {quote(tensor.name)} refers to external data that is not loaded; "
                "pass the model's file path instead, so its external data is validated and read"
            )
        _check_tensor_data(tensor, origin)
    for g in model_graphs(model):
        for v in (*g.input, *g.output, *g.value_info):
            _check_type(v.type, origin, v.name)
            if _holds_map(v.type):
                _refuse_map(g, v.name, origin)
    for fn in model.functions:
        for v in fn.value_info:
            _check_type(v.type, origin, v.name)


def _holds_map(tp: onnx.TypeProto) -> bool:
    """Whether a value of type ``tp`` is or holds a map (``seq(map(int64, float))``: a ZipMap's output)."""
    kind = tp.WhichOneof("value")
    if kind == "map_type":
        return True
    if kind == "sequence_type":
        return _holds_map(tp.sequence_type.elem_type)
    if kind == "optional_type":
        return _holds_map(tp.optional_type.elem_type)
    return False


def _refuse_map(graph: onnx.GraphProto, name: str, origin: str) -> None:
    """Refuse a model with a map-typed value: onnx_ir, the IR every conversion runs on, holds no map
    type (it raised NotImplementedError, an internal error). Most such models are scikit-learn
    classifiers written by skl2onnx with its default ZipMap output, which repackages the FP32
    probability tensor as one dict per row; skl2onnx writes that tensor as the output instead when
    asked, so the line says how; other exporters (CatBoost's own ONNX export always ends in ZipMap) have no
    such option, so it also says which tensor to make the output instead."""
    producer = next((n for n in graph.node if name in n.output), None)
    if producer is not None and producer.op_type == "ZipMap":
        raise ModelLoadError(
            f"{origin}: map-typed output {quote(name)} (ZipMap) cannot be converted: make the ZipMap's input "
            f"{quote(producer.input[0])}, the probabilities as a tensor, the graph output instead (delete the ZipMap "
            "node; skl2onnx writes it so with options={id(clf): {'zipmap': False}})"
        )
    raise ModelLoadError(
        f"{origin}: {quote(name)} is map-typed, which this compiler cannot convert: export the model so that "
        "its inputs and outputs are tensors"
    )


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
