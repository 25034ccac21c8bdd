"""Why a vertex of the ONNX precision graph cannot change its dtype: the reasons decisions show.

A vertex is fixed when one of its slots is (a graph input kept by ``keep_io_types``, a slot of an op
without a schema or of unknown element type, ...), when its slots disagree, when it is not FP32
already, when a schema does not allow the target type at the model's opset, when its op is never
touched (NONFLOAT), or when its op sets the output's type itself (a Cast between float types is a
precision boundary the model chose).
"""

from __future__ import annotations

from collections.abc import Mapping

import onnx_ir as ir

from amp_compiler.core.graph import CONTROL_FLOW_OPS, SlotKind, Vertex
from amp_compiler.dtypes import FLOAT_TYPES
from amp_compiler.onnx.ir.slots import Slot, tensor_dtype
from amp_compiler.policy import Category
from amp_compiler.targets import Target

__all__ = ["fixed_reason"]


def fixed_reason(
    vertex: Vertex, slots: list[Slot], dtypes: set, fixed: Mapping[Slot, str],
    allowed: Mapping[Slot, frozenset[str] | None], target: Target,
) -> str | None:
    """Why ``vertex`` (its ``slots``, the element types they have) keeps its dtype, or None when it is
    a free choice. ``fixed``: the slots fixed for a reason of their own; ``allowed``: per slot the
    types its schema allows (None: no schema)."""
    for s in slots:
        if s in fixed:
            return fixed[s]
    if len(dtypes) > 1:
        return "its slots disagree on the element type"
    dtype = vertex.dtype
    if dtype is None:
        return "its element type is unknown"  # every slot of it was fixed above: not reached
    if dtype is not ir.DataType.FLOAT:
        return f"it is already {dtype.name.lower()}"
    for s in slots:
        types = allowed.get(s)
        if types is not None and target.type_str not in types:
            who = s.owner.op_type if isinstance(s.owner, ir.Node) else "graph"
            return f"the {who} schema does not allow {target.value} at this opset"
    node = vertex.node
    if node is not None:
        if vertex.policy is not None and vertex.policy.category is Category.NONFLOAT:
            return f"{node.op_type}: {vertex.policy.reason}"  # the reason says it is never touched
        has_input = any(s.kind is SlotKind.NODE_IN for s in slots)
        if not has_input and node.op_type not in CONTROL_FLOW_OPS:
            attr = vertex.policy.dtype_attr if vertex.policy is not None else None
            if attr is None:
                return f"{node.op_type} sets this output's type itself"
            if any(tensor_dtype(v)[1] in FLOAT_TYPES for v in node.inputs if v is not None):
                return f"{node.op_type} between float types is an explicit precision boundary"
    return None
