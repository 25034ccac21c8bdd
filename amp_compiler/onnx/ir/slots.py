"""The ONNX frontend's slots: the node and graph inputs and outputs where a tensor's dtype is fixed."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import onnx_ir as ir

from amp_compiler.core.graph import SlotKind
from amp_compiler.onnx.ir.walk import is_constant

__all__ = [
    "GRAPH_IN", "GRAPH_OUT", "NODE_IN", "NODE_OUT", "Slot", "attribute_value", "constant_input", "is_absent",
    "shape_codes", "slot_order", "tensor_dtype",
]

NODE_IN, NODE_OUT, GRAPH_IN, GRAPH_OUT = SlotKind.NODE_IN, SlotKind.NODE_OUT, SlotKind.GRAPH_IN, SlotKind.GRAPH_OUT


class Slot(NamedTuple):
    """One node input/output or graph input/output. Equal (and hashed) by kind, owner identity
    (nodes and graphs compare by identity) and index; a tuple, so hashing and comparing run in C.
    Implements :class:`amp_compiler.core.graph.SlotView`."""

    kind: SlotKind
    owner: ir.Node | ir.Graph
    index: int  # type: ignore[assignment]  # shadows tuple.index, which nothing calls on a slot

    @property
    def value(self) -> ir.Value | None:
        kind = self.kind
        if kind is NODE_IN or kind is GRAPH_IN:
            return self.owner.inputs[self.index]
        return self.owner.outputs[self.index]

    @property
    def defines(self) -> bool:
        """True for slots that produce their tensor (node outputs, graph inputs)."""
        kind = self.kind
        return kind is NODE_OUT or kind is GRAPH_IN


def slot_order(s: Slot) -> tuple:
    """Slots of a vertex: node outputs first, then by kind and index."""
    return (s.kind is not NODE_OUT, s.kind.value, s.index)


def tensor_dtype(value: ir.Value | None) -> tuple[bool, ir.DataType | None]:
    """(is a tensor or unknown, dtype) for a value; sequences and optionals are not tensors."""
    if value is None:
        return False, None
    if value.type is None:
        return True, None
    if isinstance(value.type, ir.TensorType):
        return True, value.type.dtype
    return False, None


def attribute_value(node: ir.Node, name: str) -> object:
    """A node's attribute value by name, strings as str; None when absent (what a policy entry's
    ``[[op.when]]`` cases and a kernel's attribute limits are matched against)."""
    attr = node.attributes.get(name)
    value = None if attr is None else attr.value
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def constant_input(node: ir.Node, index: int) -> bool:
    """Whether the node's input ``index`` is present and a constant (an initializer or a Constant node's
    output): what a ``[[op.when]]`` case's ``constant_inputs`` are matched against."""
    inputs = node.inputs
    value = inputs[index] if index < len(inputs) else None
    return value is not None and is_constant(value)


def is_absent(value: ir.Value | None) -> bool:
    """True for an optional input or output the node leaves out (None, or an output named "")."""
    return value is None or (value.name == "" and not value.uses() and not value.is_graph_output())


def shape_codes(values: Iterable[ir.Value | None]) -> tuple:
    """What slot creation reads of each value: absent (None), untyped ("?"), a tensor's dtype, or a
    container ("C")."""
    codes: list[object] = []
    for v in values:
        if v is None or (v.name == "" and is_absent(v)):
            codes.append(None)
            continue
        vtype = v.type
        if vtype is None:
            codes.append("?")
        elif isinstance(vtype, ir.TensorType):
            codes.append(vtype.dtype)
        else:
            codes.append("C")
    return tuple(codes)
