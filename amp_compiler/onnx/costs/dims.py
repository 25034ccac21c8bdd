"""Symbolic dims: the values the given input shapes bind ``dim_param`` names to, and the simple
expressions exporters write in dims (``Min(64, sequence)``, ``2*sequence``, ``sequence + 1``)
evaluated with them.

An expression is evaluated only when it is made of integers, bound names, ``+ - * //  %`` and the
functions ``Min``, ``Max``, ``floor``, ``ceiling`` (the names torch.export's sympy dims print);
anything else is unknown (None), never evaluated as Python.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable, Mapping

import onnx

__all__ = ["bindings", "dim_value", "evaluate"]

_FUNCTIONS: dict[str, Callable[..., int]] = {"Min": min, "Max": max, "floor": math.floor, "ceiling": math.ceil}
_OPERATORS: dict[type, Callable[[int, int], int]] = {
    ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
    ast.FloorDiv: lambda a, b: a // b, ast.Mod: lambda a, b: a % b,
}


def bindings(model: onnx.ModelProto, input_shapes: Mapping[str, tuple[int, ...]]) -> dict[str, int]:
    """The value of each ``dim_param`` of the model's graph inputs that ``input_shapes`` fix."""
    out: dict[str, int] = {}
    for info in model.graph.input:
        shape = input_shapes.get(info.name)
        tt = info.type.tensor_type
        if shape is None or not tt.HasField("shape") or len(tt.shape.dim) != len(shape):
            continue
        for d, value in zip(tt.shape.dim, shape, strict=True):
            if d.HasField("dim_param"):
                out.setdefault(d.dim_param, value)
    return out


def evaluate(text: str, bound: Mapping[str, int]) -> int | None:
    """The value of the dim expression ``text`` with ``bound`` names, or None (see the module doc)."""
    if text in bound:
        return bound[text]
    if len(text) > 200:
        return None
    try:
        tree = ast.parse(text, mode="eval").body
        value = _eval(tree, bound)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError, TypeError):
        return None
    return value if isinstance(value, int) and value > 0 else None


def _eval(node: ast.AST, bound: Mapping[str, int]) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.Name) and node.id in bound:
        return bound[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_eval(node.left, bound), _eval(node.right, bound))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_eval(node.operand, bound)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS
            and node.args and not node.keywords):
        return int(_FUNCTIONS[node.func.id](*(_eval(a, bound) for a in node.args)))
    raise ValueError("not a dim expression")


def dim_value(dim: onnx.TensorShapeProto.Dimension, bound: Mapping[str, int]) -> int | None:
    """A dim's value: its own, or its ``dim_param`` evaluated with ``bound``; None when unknown."""
    if dim.HasField("dim_value"):
        return dim.dim_value if dim.dim_value > 0 else None
    if dim.HasField("dim_param"):
        return evaluate(dim.dim_param, bound)
    return None
