"""Element types for the tensors onnx's shape inference left untyped, from the ops' schemas.

onnx's inference has no schema, so no type function, for the ops onnxruntime adds (``com.microsoft``'s
Attention, SkipLayerNormalization, GroupQueryAttention, ..., and SimplifiedLayerNormalization in the
default domain), and types nothing downstream of them that takes its type from them (the MatMul after
a SkipLayerNormalization, an unfused attention's Reshape/Transpose chain). Their schemas still say
which of their inputs and outputs share a type parameter (:mod:`amp_compiler.policy.schemas`): all the
tensors an op binds to one type parameter have one element type. Over the whole model, tensors linked
that way form classes; a class in which some tensor has a type gives it to its untyped members. A
formal of a fixed type (``tensor(int32)``) or of a type parameter that allows one type alone gives
that type. Classes whose tensors disagree are left alone, and so are tensors of ops without a schema
(a class can still type them from their users). Only element types are set, never shapes, and only
on tensors without a type.
"""

from __future__ import annotations

import onnx_ir as ir

from amp_compiler.core.graph import CONTROL_FLOW_OPS, UnionFind
from amp_compiler.dtypes import from_schema_type
from amp_compiler.onnx.ir.slots import is_absent
from amp_compiler.onnx.ir.walk import iter_graphs
from amp_compiler.policy import schemas

__all__ = ["type_from_schemas", "untyped_values"]


def untyped_values(model: ir.Model) -> list[ir.Value]:
    """Node outputs and graph inputs/outputs of every graph that have no type."""
    out: list[ir.Value] = []
    for g in iter_graphs(model.graph):
        out.extend(v for v in g.inputs if v.type is None)
        out.extend(v for node in g for v in node.outputs if v.type is None and v.name)
        out.extend(v for v in g.outputs if v.type is None)
    return out


def type_from_schemas(model: ir.Model) -> int:
    """Give the untyped tensors of ``model`` the element types their ops' schemas imply (see the
    module docstring); returns how many were typed."""
    if not untyped_values(model):
        return 0
    classes: UnionFind[ir.Value] = UnionFind()
    implied: dict[ir.Value, ir.DataType] = {}  # from fixed-type formals and one-type parameters
    imports = model.opset_imports
    for g in iter_graphs(model.graph):
        for node in g:
            if node.op_type in CONTROL_FLOW_OPS and schemas.is_onnx_domain(node.domain):
                continue  # their values' types follow their bodies: onnx's inference types them
            sig = schemas.lookup(node.domain, node.op_type, schemas.opset_in(imports, node.domain))
            if sig is not None:
                _bind(sig, node, classes, implied)
    typed = 0
    for members in classes.groups().values():
        dtypes = {d for v in members if (d := _dtype(v, implied)) is not None}
        if len(dtypes) != 1:
            continue
        dtype = dtypes.pop()
        for value in members:
            if value.type is None:
                value.type = ir.TensorType(dtype)
                typed += 1
    return typed


def _bind(sig: schemas.OpSignature, node: ir.Node, classes: UnionFind[ir.Value], implied: dict) -> None:
    """Union the node's tensors that share a type parameter; note the types its formals imply."""
    first: dict[object, ir.Value] = {}
    for is_input, values in ((True, node.inputs), (False, node.outputs)):
        for i, value in enumerate(values):
            if value is None or is_absent(value):
                continue
            if value.type is not None and not isinstance(value.type, ir.TensorType):
                continue  # a sequence or an optional
            key = sig.type_key(is_input, i)
            if key is None or isinstance(key, tuple):
                continue  # no formal here, or one of a heterogeneous variadic (each its own type)
            classes.add(value)
            allowed = sig.allowed_types(is_input, i)
            if len(allowed) == 1:
                dtype = from_schema_type(next(iter(allowed)))
                if dtype is not None:
                    implied.setdefault(value, dtype)
            root = first.setdefault(key, value)
            if root is not value:
                classes.union(root, value)


def _dtype(value: ir.Value, implied: dict[ir.Value, ir.DataType]) -> ir.DataType | None:
    vtype = value.type
    if isinstance(vtype, ir.TensorType):
        return vtype.dtype
    return implied.get(value)

