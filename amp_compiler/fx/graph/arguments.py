"""Arguments of ATen calls in an FX graph: reading and rewriting tensor and schema arguments."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx

__all__ = [
    "has_dtype_argument", "mutated_arguments", "replace_tensor_arguments", "scalar_constants", "schema_argument",
    "set_schema_argument", "tensor_arguments", "viewed",
]

# Schema types of the arguments a Python float can be passed for (Tensor and Scalar arguments).
_SCALAR_TYPES = ("Tensor", "Optional[Tensor]", "number", "Optional[number]")


def tensor_arguments(node: fx.Node) -> list[tuple[str | None, fx.Node]]:
    """(schema argument name, node) for every node among ``node``'s args then kwargs, in map_arg order."""
    names = _positional_names(node)
    out: list[tuple[str | None, fx.Node]] = []

    def collect(name: str | None) -> Callable[[fx.Node], fx.Node]:
        def add(n: fx.Node) -> fx.Node:
            out.append((name, n))
            return n

        return add

    for i, a in enumerate(node.args):
        fx.node.map_arg(a, collect(names[i] if i < len(names) else None))
    for key, a in node.kwargs.items():
        fx.node.map_arg(a, collect(key))
    return out


def replace_tensor_arguments(node: fx.Node, replacements: dict[int, fx.Node]) -> None:
    """Replace the tensor arguments at the given positions (as numbered by :func:`tensor_arguments`)."""
    if not replacements:
        return
    counter = iter(range(1 << 30))

    def swap(n: fx.Node) -> fx.Node:
        return replacements.get(next(counter), n)

    args = tuple(fx.node.map_arg(a, swap) for a in node.args)
    kwargs = {k: fx.node.map_arg(a, swap) for k, a in node.kwargs.items()}
    node.args = args
    node.kwargs = kwargs


def _positional_names(node: fx.Node) -> list[str]:
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return [a.name for a in target._schema.arguments if not a.kwarg_only]
    return []


def schema_argument(node: fx.Node, name: str) -> tuple[bool, Any]:
    """(present, value) of the schema argument ``name`` in the call (keyword or positional)."""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return False, None
    if name in node.kwargs:
        return True, node.kwargs[name]
    for i, a in enumerate(target._schema.arguments):
        if a.name == name:
            if not a.kwarg_only and i < len(node.args):
                return True, node.args[i]
            return False, a.default_value if a.has_default_value() else None
    return False, None


def set_schema_argument(node: fx.Node, name: str, value: Any) -> None:
    """Set the schema argument ``name`` of an ATen call (where the call passes it, else as a keyword)."""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        raise TypeError(f"{node.name} does not call an ATen operator")
    for i, a in enumerate(target._schema.arguments):
        if a.name == name and not a.kwarg_only and i < len(node.args) and name not in node.kwargs:
            args = list(node.args)
            args[i] = value
            node.args = tuple(args)
            return
    kwargs = dict(node.kwargs)
    kwargs[name] = value
    node.kwargs = kwargs


def has_dtype_argument(node: fx.Node) -> bool:
    target = node.target
    return isinstance(target, torch._ops.OpOverload) and any(
        a.name == "dtype" for a in target._schema.arguments
    )


def scalar_constants(node: fx.Node) -> list[tuple[str, float]]:
    """Python floats the call passes where the schema takes a Tensor or Scalar."""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return []
    out = []
    args = target._schema.arguments
    for i, a in enumerate(args):
        if a.kwarg_only or i >= len(node.args):
            value = node.kwargs.get(a.name)
        else:
            value = node.args[i]
        if isinstance(value, float) and str(a.type) in _SCALAR_TYPES:
            out.append((a.name, value))
    return out


def mutated_arguments(node: fx.Node) -> set[str]:
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return set()
    return {
        a.name for a in target._schema.arguments if a.alias_info is not None and a.alias_info.is_write
    }


def viewed(node: fx.Node) -> fx.Node | None:
    """The tensor ``node`` is a view of (its first tensor argument), or None if it is not a view."""
    if node.op != "call_function":
        return None
    if node.target is operator.getitem:
        source = node.args[0]
        if not isinstance(source, fx.Node) or source.op != "call_function":
            return None
        node = source
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return None
    if not any(r.alias_info is not None for r in target._schema.returns):
        return None
    args = tensor_arguments(node)
    return args[0][1] if args else None
