"""The precision the user declared for custom ops (``custom_op_precision``), checked against the model.

An op no table knows (no schema in onnx or onnxruntime: a custom domain's op, a TensorRT plugin)
keeps the types the model gives it, so a conversion leaves it FP32 with Casts around it. A TensorRT
plugin declares its output types, and its author knows them: a declaration gives the op's float
inputs and outputs that type instead (:func:`amp_compiler.onnx.graph.precision_graph.build_precision_graph`).
"""

from __future__ import annotations

from collections.abc import Iterable

import onnx_ir as ir

from amp_compiler.dtypes import from_short_name
from amp_compiler.errors import OptionError
from amp_compiler.options import check_custom_op_precision
from amp_compiler.policy import schemas

__all__ = ["declared_types"]


def declared_types(model: ir.Model, pairs: Iterable[tuple[str, str]]) -> dict[tuple[str, str], ir.DataType]:
    """The declared element type of each custom op of ``model`` named in ``pairs`` ((op, "fp16" |
    "bf16" | "fp32"), op as "Op" or "domain::Op"), by (domain, op). An :class:`OptionError` names a
    declaration that matches no custom op of the model (a known op's precision is the tables')."""
    pairs = list(pairs)
    if not pairs:
        return {}
    check_custom_op_precision(pairs)
    custom: set[tuple[str, str]] = set()
    known: set[str] = set()
    for graph in model.graphs():
        for node in graph:
            key = (node.domain or "", node.op_type)
            if key in custom:
                continue
            if schemas.lookup(key[0], key[1], schemas.opset_in(model.opset_imports, key[0])) is None:
                custom.add(key)
            else:
                known.add(node.op_type)
    out: dict[tuple[str, str], ir.DataType] = {}
    for op, precision in pairs:
        domain, _, name = op.rpartition("::")
        matches = [k for k in sorted(custom) if k[1] == name and (not domain or k[0] == domain)]
        if not matches:
            if name in known:
                raise OptionError(
                    f"{op} is an op the op tables know: its precision is theirs (block_ops keeps it FP32)",
                    option="custom_op_precision",
                )
            have = ", ".join(f"{d or 'ai.onnx'}::{o}" for d, o in sorted(custom)) or "none"
            raise OptionError(f"{op}: no custom op of the model has that name (its custom ops: {have})",
                              option="custom_op_precision")
        dtype = from_short_name(precision)
        assert dtype is not None  # checked above
        for key in matches:
            out[key] = dtype
    return out
