"""Sparse tensors made dense before the IR is built: ``sparse_initializer`` and ``Constant(sparse_value)``.

onnx_ir (1.1) drops a graph's ``sparse_initializer`` entries (its readers then see an input that
nothing defines) and refuses a Constant's ``sparse_value``. onnxruntime densifies sparse initializers
when it loads a model anyway, so the conversion does the same first: each becomes a dense
initializer (or ``Constant(value)``) of the same name, checked on the way (COO indices in range,
their count matching the values) and refused when its dense form would not fit a model
(:data:`MAX_DENSE_BYTES` for all of them: dims of 1e6 x 1e6 with three values are 4 TB dense).
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import numpy_helper

from amp_compiler.errors import ModelLoadError
from amp_compiler.onnx.load.proto_walk import iter_proto_graphs
from amp_compiler.onnx.load.text import quote
from amp_compiler.sizes import format_bytes

__all__ = ["densify"]

#: The most bytes the dense forms of a model's sparse tensors may take together (protobuf's limit
#: for one message: the converted model must still be written).
MAX_DENSE_BYTES = 2**31 - 1


def has_sparse(model: onnx.ModelProto) -> bool:
    """True when some graph has a sparse initializer or a Constant with a sparse value."""
    return any(
        len(g.sparse_initializer) or any(_sparse_attribute(n) is not None for n in g.node if n.op_type == "Constant")
        for g in iter_proto_graphs(model.graph)
    )


def _sparse_attribute(node: onnx.NodeProto) -> onnx.AttributeProto | None:
    return next((a for a in node.attribute if a.name == "sparse_value"), None)


def densify(model: onnx.ModelProto, origin: str = "model") -> onnx.ModelProto:
    """``model`` with its sparse tensors dense (a copy; ``model`` itself when it has none)."""
    if not has_sparse(model):
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    left = MAX_DENSE_BYTES
    for g in iter_proto_graphs(out.graph):
        for sparse in g.sparse_initializer:
            dense = _dense(sparse, origin, left)
            left -= dense.nbytes
            g.initializer.append(numpy_helper.from_array(dense, sparse.values.name))
        del g.sparse_initializer[:]
        for node in g.node:
            attr = _sparse_attribute(node) if node.op_type == "Constant" else None
            if attr is None:
                continue
            dense = _dense(attr.sparse_tensor, origin, left)
            left -= dense.nbytes
            value = onnx.helper.make_attribute("value", numpy_helper.from_array(dense, attr.sparse_tensor.values.name))
            node.attribute.remove(attr)
            node.attribute.append(value)
    return out


def _dense(sparse: onnx.SparseTensorProto, origin: str, budget: int) -> np.ndarray:
    """The dense array of a COO sparse tensor (indices ``[NNZ, rank]`` or linear ``[NNZ]``)."""
    name = sparse.values.name
    where = f"{origin}: invalid ONNX model: sparse tensor {quote(name)}"
    dims = [int(d) for d in sparse.dims]
    if any(d < 0 for d in dims):
        raise ModelLoadError(f"{where} has a negative dimension in {dims}")
    try:
        values = numpy_helper.to_array(sparse.values)
        indices = numpy_helper.to_array(sparse.indices) if sparse.HasField("indices") else np.zeros((0,), np.int64)
    except (ValueError, TypeError) as exc:
        raise ModelLoadError(f"{where}: unreadable values or indices ({exc})") from None
    size = math.prod(dims)
    nbytes = size * values.dtype.itemsize
    if nbytes > budget:
        raise ModelLoadError(
            f"{origin}: sparse tensor {quote(name)} of shape {dims} takes {format_bytes(nbytes)} dense, more than "
            f"a model may hold ({format_bytes(MAX_DENSE_BYTES)} for all its sparse tensors); refused"
        )
    nnz = values.size
    if indices.ndim == 2 and indices.shape == (nnz, len(dims)) and dims:
        if nnz and (np.any(indices < 0) or np.any(indices >= np.array(dims))):
            raise ModelLoadError(f"{where} has an index outside its shape {dims}")
        linear = np.ravel_multi_index(tuple(indices.T), dims) if nnz else np.zeros(0, np.int64)
    elif indices.ndim == 1 and indices.size == nnz:
        if nnz and (np.any(indices < 0) or np.any(indices >= size)):
            raise ModelLoadError(f"{where} has an index outside its {size} elements")
        linear = indices
    else:
        raise ModelLoadError(f"{where}: {nnz} values but indices of shape {list(indices.shape)}")
    dense = np.zeros(size, dtype=values.dtype)
    dense[linear] = values.ravel()
    return dense.reshape(dims)
