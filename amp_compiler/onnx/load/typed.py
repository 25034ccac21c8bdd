"""The typed IR a conversion starts from: the model checked, deserialized, and typed by shape inference
(then by the ops' schemas, where onnx's inference types nothing: :mod:`amp_compiler.onnx.ir.schema_typing`).

For models of ``CHILD_MIN_NODES`` nodes or more, onnx's checker and shape inference run in a child
process (:mod:`amp_compiler.onnx.load.native_checks`) while this one checks the rest and deserializes the
IR; inferred types are then applied to the IR without deserializing the inferred model again.
"""

from __future__ import annotations

import sys
from typing import Literal

import onnx
import onnx_ir as ir
from onnx_ir import serde

from amp_compiler.errors import ModelLoadError
from amp_compiler.onnx.ir.schema_typing import type_from_schemas
from amp_compiler.onnx.ir.walk import iter_graphs
from amp_compiler.onnx.load import native_checks
from amp_compiler.onnx.load.foreign_ops import foreign_ops
from amp_compiler.onnx.load.skeleton import weight_free
from amp_compiler.onnx.load.validate import (
    check_model_contents,
    checker_input,
    checker_verdict,
)

__all__ = ["checked_typed_ir"]


def checked_typed_ir(proto: onnx.ModelProto, origin: str, *, deferred: bool, check: bool) -> ir.Model:
    """The model as IR with every tensor's type inferred (by onnx's shape inference, then from the
    schemas of the ops it cannot type), after checking it (unless ``check`` is
    False: it was checked already) as :func:`~amp_compiler.onnx.load.validate.check_model_valid` does.

    For models of ``CHILD_MIN_NODES`` nodes or more, onnx's checker and shape inference (C++, about
    a second each at 100,000 nodes) run in a child process (:mod:`amp_compiler.onnx.load.native_checks`) while
    this one checks the rest and deserializes the IR; the IR is used only once every check passed.
    Smaller models do the same steps in this process. A model onnx_ir cannot deserialize gets the
    checker's verdict first, which names the fault. A value_info entry whose element type
    contradicts inference makes the model invalid; one whose shape does gives way to inference
    (:func:`~amp_compiler.onnx.load.native_checks.infer_checked`).
    """
    # Large float weights are described by type and shape only (skeleton.py): neither C++ call
    # reads them, and serializing them for each would cost more than both calls.
    described = weight_free(proto)
    to_infer = proto if described is None else described
    found = foreign_ops(proto) if check else None
    to_check = checker_input(to_infer, deferred or described is not None, found) if check else None
    native = None
    if len(proto.graph.node) >= native_checks.CHILD_MIN_NODES and sys.executable:
        try:
            native = native_checks.NativeChecks(to_check, to_infer)
        except OSError:  # no child process here: do it all in this one
            native = None
    try:
        if check:
            check_model_contents(proto, origin, deferred=deferred, found=found)
        try:
            model = ir.from_proto(proto)
        except Exception:
            native_result(native, to_infer, origin, to_check)  # raises for an invalid model
            raise
    except BaseException:
        if native is not None:
            native.cancel()
        raise
    types = native_result(native, to_infer, origin, to_check)
    if types is not None and types.type_conflicts:
        raise ModelLoadError(f"{origin}: invalid ONNX model: {types.type_conflicts[0]}")
    model = typed_ir(proto, model, types)
    type_from_schemas(model)  # what onnx's inference cannot type: contrib ops and what follows them
    return model


def native_result(
    native: native_checks.NativeChecks | None, proto: onnx.ModelProto, origin: str, to_check: onnx.ModelProto | None
) -> native_checks.InferredTypes | None:
    """The checker's verdict (raised when it refuses the model) and shape inference's types of
    ``proto`` (the model, or its weight-free description): from the child process, or computed here
    (no child, or a child that failed for reasons of its own)."""
    if native is not None:
        result = native.result()
        if result.crashed:
            raise ModelLoadError(
                f"{origin}: onnx's checker or shape inference stopped on this model ({result.crashed})"
            )
        if not result.failed:
            if to_check is not None:
                checker_verdict(proto, origin, result.checker_error)
            return result.types
    if to_check is not None:
        checker_verdict(proto, origin, native_checks.check(to_check))
    return native_checks.inferred_types(proto)


def typed_ir(proto: onnx.ModelProto, model: ir.Model, types: native_checks.InferredTypes | None) -> ir.Model:
    """``model`` (``ir.from_proto(proto)``) with the types shape inference found (``types``; None:
    it failed, and the model keeps the types it declares).

    Faster than ``ir.from_proto`` of the inferred model: each distinct inferred entry is decoded
    once, and plain tensor types share one frozen Shape. Anything unusual (a doc string or metadata
    on an inferred entry, a non-tensor type) takes onnx_ir's own path, and so does the whole model
    when inference changed a function or the graphs do not match.
    """
    if types is None:
        return model
    ir_graphs = list(iter_graphs(model.graph))
    if types.functions_changed or len(ir_graphs) != len(types.graphs) or any(
        (g.name or "") != t.name or len(g) != t.nodes for g, t in zip(ir_graphs, types.graphs, strict=True)
    ):
        typed = native_checks.infer(proto)
        return model if typed is None else ir.from_proto(typed)
    entries = [_Entry(data) for data in types.table]
    for g, t in zip(ir_graphs, types.graphs, strict=True):
        for value, k in zip(g.inputs, t.inputs, strict=False):
            serde.deserialize_value_info_proto(entries[k].info, value)
        lookup = t.value_info
        if lookup:
            for value in g.initializers.values():
                if not value.is_graph_input() and value.name in lookup:
                    entries[lookup[value.name]].apply(value)
            get = lookup.get
            for node in g:
                for value in node.outputs:
                    name = value.name
                    found = get(name) if name else None
                    if found is not None:
                        entries[found].apply(value)
        for value, k in zip(g.outputs, t.outputs, strict=False):
            serde.deserialize_value_info_proto(entries[k].info, value)
    return model


class _Entry:
    """One distinct inferred ValueInfoProto (its name cleared), decoded on first use."""

    __slots__ = ("data", "_info", "_plain")

    def __init__(self, data: bytes):
        self.data = data
        self._info: onnx.ValueInfoProto | None = None
        self._plain: tuple[ir.Shape | None, ir.DataType | None] | Literal[False] | None = None  # None: not decoded yet

    @property
    def info(self) -> onnx.ValueInfoProto:
        if self._info is None:
            self._info = onnx.ValueInfoProto.FromString(self.data)
        return self._info

    def apply(self, value: ir.Value) -> None:
        """``serde.deserialize_value_info_proto(self.info, value)``, decoded once for plain tensor types."""
        if self._plain is None:
            info = self.info
            type_proto = info.type
            plain = (
                type_proto.WhichOneof("value") == "tensor_type" and not type_proto.denotation
                and not info.doc_string and not len(info.metadata_props)
            )
            if plain:
                tensor_type = serde.deserialize_type_proto_for_type(type_proto)
                dtype = None if tensor_type is None else tensor_type.dtype
                self._plain = (serde.deserialize_type_proto_for_shape(type_proto), dtype)
            else:
                self._plain = False
        if self._plain is False:
            serde.deserialize_value_info_proto(self.info, value)
            return
        shape, dtype = self._plain
        value.shape = shape  # frozen: safe to share
        value.type = None if dtype is None else ir.TensorType(dtype)
        value.doc_string = None
