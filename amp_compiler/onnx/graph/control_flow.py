"""Control flow: the values If, Loop and Scan pass across their bodies, which share one dtype."""

from __future__ import annotations

import onnx_ir as ir

from amp_compiler.onnx.ir.slots import GRAPH_IN, GRAPH_OUT, NODE_IN, NODE_OUT, Slot

__all__ = ["carried_values"]


def _body(node: ir.Node, name: str) -> ir.Graph | None:
    attr = node.attributes.get(name)
    return attr.value if attr is not None and attr.type == ir.AttributeType.GRAPH else None


def carried_values(node: ir.Node, opset: int) -> list[tuple[Slot, ...]]:
    """Groups of slots of an If, Loop or Scan node and its bodies that hold one value and so must
    share a dtype (``opset``: the model's default-domain opset). A slot in a group may not exist
    (no float tensor there, or no such position): the caller skips those.

    - If: each output with both branches' outputs at its position.
    - Loop: each loop-carried value (node input ``2 + k``, body input ``2 + k``, body output
      ``1 + k``, node output ``k``), and each scan output with its body output.
    - Scan (opset 9 and later): each input with its body input, each output with its body output,
      and each state variable's body input with its body output.
    """
    op = node.op_type
    groups: list[tuple[Slot, ...]] = []
    if op == "If":
        then_g, else_g = _body(node, "then_branch"), _body(node, "else_branch")
        if then_g is None or else_g is None:
            return groups
        for k in range(len(node.outputs)):
            groups.append((Slot(NODE_OUT, node, k), Slot(GRAPH_OUT, then_g, k), Slot(GRAPH_OUT, else_g, k)))
    elif op == "Loop":
        body = _body(node, "body")
        if body is None:
            return groups
        n_carried = max(len(node.inputs) - 2, 0)
        for k in range(n_carried):
            groups.append((
                Slot(NODE_IN, node, 2 + k), Slot(GRAPH_IN, body, 2 + k),
                Slot(GRAPH_OUT, body, 1 + k), Slot(NODE_OUT, node, k),
            ))
        for j in range(n_carried, len(node.outputs)):
            groups.append((Slot(GRAPH_OUT, body, 1 + j), Slot(NODE_OUT, node, j)))
    elif op == "Scan":
        body = _body(node, "body")
        n_scan = node.attributes.get("num_scan_inputs")
        if body is None or n_scan is None or opset < 9:
            return groups
        n_state = len(node.inputs) - n_scan.as_int()
        for k in range(len(node.inputs)):
            groups.append((Slot(NODE_IN, node, k), Slot(GRAPH_IN, body, k)))
        for k in range(len(node.outputs)):
            groups.append((Slot(GRAPH_OUT, body, k), Slot(NODE_OUT, node, k)))
            if k < n_state:
                groups.append((Slot(GRAPH_IN, body, k), Slot(GRAPH_OUT, body, k)))
    return groups
