"""The scale a float graph input's first product expects, read from its weights: the ONNX path's check on FX graphs.

:mod:`amp_compiler.onnx.graph.input_scale` explains the check: a trained first product makes each
input feature's contribution of order one, so a feature whose weights are all near ``1e-8`` takes
values near ``1e8`` (a timestamp, an income in raw units), past FP16's 65504: the cast of that input to
FP16 is infinite. The example inputs show such values only when the user gave real ones; N(0, 1)
examples show nothing. :func:`weight_scale_warnings` walks from each float graph input through ops
that keep its values and its last axis (views, reshapes, dtype casts) to the ``linear``/``mm``/
``addmm``/``matmul`` nodes that read it as their activation with a parameter or buffer as their 2-D
weight, and, for those computed in low precision, gives the ONNX path's sentence
(:func:`~amp_compiler.onnx.graph.input_scale.scale_warning`). It is a warning, not a pin, as there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import torch
import torch.fx as fx

from amp_compiler.fx.graph.policy import op_name, policy_name
from amp_compiler.onnx.graph.input_scale import scale_warning

__all__ = ["weight_scale_warnings"]

# ATen ops whose output holds their first argument's values, its last axis (the features) kept.
_SAME_VALUES = frozenset({
    "view", "_unsafe_view", "reshape", "flatten", "unsqueeze", "squeeze", "_to_copy", "to", "clone",
    "contiguous", "alias", "detach", "dropout",
})
# Products: (the activation's argument position, the weight's, whether the weight is [outputs, features]).
_PRODUCTS = {"linear": (0, 1, True), "mm": (0, 1, False), "matmul": (0, 1, False), "addmm": (1, 2, False)}


def _aten(node: fx.Node) -> str | None:
    name = op_name(node.target) if node.op == "call_function" else None
    return policy_name(name) if name is not None else None


def _constant(gm: fx.GraphModule, node: object) -> np.ndarray | None:
    """A ``get_attr`` node's float 2-D tensor, as float64, when all of it is finite."""
    if not isinstance(node, fx.Node) or node.op != "get_attr":
        return None
    obj: object = gm
    for part in str(node.target).split("."):
        obj = getattr(obj, part, None)
    if not isinstance(obj, torch.Tensor) or obj.ndim != 2 or not obj.is_floating_point():
        return None
    array = obj.detach().to(device="cpu", dtype=torch.float64).numpy()
    return array if np.all(np.isfinite(array)) else None


def _first_products(gm: fx.GraphModule, value: fx.Node) -> list[tuple[fx.Node, np.ndarray]]:
    """The products reading ``value`` (through :data:`_SAME_VALUES`) as their activation, with their
    constant weight as ``[features, outputs]``."""
    found: list[tuple[fx.Node, np.ndarray]] = []
    stack, seen = [value], {value}
    while stack:
        v = stack.pop()
        for user in v.users:
            if user in seen:
                continue
            seen.add(user)
            name = _aten(user)
            if name in _SAME_VALUES and user.args and user.args[0] is v:
                stack.append(user)
                continue
            if name not in _PRODUCTS:
                continue
            act, wt, transposed = _PRODUCTS[name]
            if len(user.args) <= wt or user.args[act] is not v:
                continue
            weights = _constant(gm, user.args[wt])
            if weights is not None:
                found.append((user, weights.T if transposed else weights))
    return found


def weight_scale_warnings(gm: fx.GraphModule, inputs: Iterable[fx.Node], limit: float,
                          low: Callable[[fx.Node], bool]) -> list[str]:
    """One sentence per float graph input in ``inputs`` whose first product computed in low precision
    (``low``) has weights that say it takes values past ``limit / SCALE_MARGIN`` (module doc)."""
    found = []
    for value in inputs:
        for node, weights in _first_products(gm, value):
            if not low(node):
                continue
            warning = scale_warning(weights, f"{_aten(node)} {node.name!r}", value.name, limit)
            if warning is not None:
                found.append(warning)
                break
    return [text for _, text in sorted(found, key=lambda f: -f[0])]
