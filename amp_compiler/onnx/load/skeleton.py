"""A model's weight-free description: what onnx's checker and shape inference are given for a large model.

Both are C++ calls that take the model serialized: for a model with its weights inside the file
(BERT-base: 438 MB) that is several copies of every weight (serialized for the checker, again for
shape inference, parsed back from inference's answer), for nothing: neither looks at a large float
weight's values, only at its type and shape. The description is the model with each such weight
written as an external-data tensor (type and shape kept, no bytes), as deferred loading leaves
weights on disk: shape inference types them from their dims, and the checker is given them as the
deferred path gives it deferred weights (:func:`~amp_compiler.onnx.load.validate.checker_input`).

A weight is described only where onnx's checker could say nothing about its data that our own
checks (:func:`~amp_compiler.onnx.load.validate.check_model_contents`) do not: a dense initializer of
the main graph, in one of the float element types, stored in ``raw_data`` alone (one value field)
with exactly the bytes its shape needs. Shape inference reads initializer values only for shape-like
inputs (Reshape's shape, Resize's scales, Range's bounds: a few elements), never a tensor of
``MIN_ELEMENTS`` elements or more. Anything else is passed whole, and so is the whole model when its
weights are small (the copy would cost more than it saves) or when it is too large to serialize
(the checker then says so).
"""

from __future__ import annotations

import math

import onnx

__all__ = ["weight_free"]

#: Weights of at least this many elements are described by type and shape only.
MIN_ELEMENTS = 1024
#: A description is made when it leaves out at least this many bytes.
MIN_SAVED_BYTES = 32 * 2**20
#: Where the described weights "are": a name no file has (onnx's checker never sees it: the checker's
#: input turns external tensors into empty ones; shape inference does not open it).
PLACEHOLDER = "amp-compiler-weight-described-not-stored"
#: Serialized models stop here (protobuf's limit): larger ones go to the checker whole, which refuses them.
PROTOBUF_LIMIT = 2**31 - 1

_FLOAT_BYTES: dict[int, int] = {
    onnx.TensorProto.FLOAT: 4,
    onnx.TensorProto.FLOAT16: 2,
    onnx.TensorProto.BFLOAT16: 2,
    onnx.TensorProto.DOUBLE: 8,
}
_TYPED_FIELDS = ("float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data")


def _describable(tensor: onnx.TensorProto) -> bool:
    """A plain float weight whose values neither the checker nor shape inference needs (module docstring)."""
    size = _FLOAT_BYTES.get(tensor.data_type)
    if size is None or tensor.data_location == onnx.TensorProto.EXTERNAL or not tensor.HasField("raw_data"):
        return False
    dims = tensor.dims
    if any(d < 0 for d in dims):
        return False
    count = math.prod(dims)
    if count < MIN_ELEMENTS or len(tensor.raw_data) != count * size:
        return False
    return not any(len(getattr(tensor, field)) for field in _TYPED_FIELDS)


def _described(tensor: onnx.TensorProto) -> onnx.TensorProto:
    """``tensor``'s name, element type and shape (and its doc string and metadata), its data external."""
    out = onnx.TensorProto(name=tensor.name, data_type=tensor.data_type, dims=tensor.dims)
    if tensor.doc_string:
        out.doc_string = tensor.doc_string
    out.metadata_props.extend(tensor.metadata_props)
    out.data_location = onnx.TensorProto.EXTERNAL
    out.external_data.add(key="location", value=PLACEHOLDER)
    return out


def weight_free(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """The description of ``model`` for onnx's checker and shape inference, or None when ``model``
    should be given to them as it is (small weights, or too large to serialize)."""
    if not model.HasField("graph"):
        return None
    initializers = model.graph.initializer
    describe = [_describable(t) for t in initializers]
    saved = sum(len(t.raw_data) for t, d in zip(initializers, describe, strict=True) if d)
    if not saved or saved < MIN_SAVED_BYTES:
        return None
    out = onnx.ModelProto()
    for field, value in model.ListFields():
        if field.name != "graph":
            _copy_field(out, field, value)
    for field, value in model.graph.ListFields():
        if field.name != "initializer":
            _copy_field(out.graph, field, value)
    out.graph.initializer.extend(
        _described(t) if d else t for t, d in zip(initializers, describe, strict=True)
    )
    # The model's size, over-estimated by a few bytes per weight (ByteSize of the whole model walks
    # every weight): one too large to serialize goes whole to the checker, which refuses it.
    return None if saved + out.ByteSize() > PROTOBUF_LIMIT else out


def _copy_field(dst: onnx.ModelProto | onnx.GraphProto, field, value) -> None:  # noqa: ANN001 - protobuf's types
    if field.is_repeated:
        getattr(dst, field.name).extend(value)
    elif field.type == field.TYPE_MESSAGE:
        getattr(dst, field.name).CopyFrom(value)
    else:
        setattr(dst, field.name, value)
