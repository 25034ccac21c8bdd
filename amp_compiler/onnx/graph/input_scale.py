"""The scale a float graph input's first product expects, read from its weights.

A trained network's first matrix product makes each input feature's contribution ``w * x`` a
quantity of order one: a feature whose weights are all near ``1e-5`` is one whose values are near
``1e5``. A tabular model fed raw units (an income in dollars, a population) is trained so, and FP16
holds no value past 65504: the Cast of such an input to FP16 is infinite, and every output after it.
Nothing else in the graph says so (no normalization reads the input), the range probe draws N(0, 1)
for an input nothing names, and the interval walk (:func:`~amp_compiler.onnx.graph.intervals.
overflow_warnings`) considers inputs up to 256 only. Measured (sweeps Q and S): a Gemm -> Relu -> Gemm
on 4 raw features, the income's weights 1e-5: the conversion stated 0.01% and 155/192 held-out outputs
were Inf/NaN; a 12-feature house-price MLP 606 NaN/Inf values and 79% of its labels flipped.

:func:`weight_scale_warnings` names, per float graph input of unknown range read (through casts and
reshapes) as the activation of a MatMul or Gemm with a constant weight, the feature whose weights are
smallest: when ``1 / max |w|`` over that feature's row exceeds a quarter of the target's largest value
(a feature of values within 4x of it has such weights), the model very likely takes values that
overflow. A feature whose weights are all exactly zero is ignored by the model and left out.
It is a warning, not a pin: the input's real values are the user's to state (``--input-range``,
``--calibration-data``), and a model whose small weights belong to an unimportant feature needs neither.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import onnx_ir as ir

from amp_compiler.dtypes import FLOAT_TYPES
from amp_compiler.onnx.ir.constants import constant_array
from amp_compiler.onnx.ir.walk import is_constant

__all__ = ["SAME_VALUES", "SCALE_MARGIN", "scale_warning", "weight_scale_warnings"]

#: A feature is taken to reach ``1 / max |w|``; a warning comes when that is past the target's largest
#: value over this margin (its weights may be a few times smaller than its values' reciprocal).
SCALE_MARGIN = 4.0
# Ops whose output holds their input's values, its last axis (the features) kept: the walk's way through.
SAME_VALUES = frozenset({"Identity", "Cast", "Reshape", "Flatten", "Unsqueeze", "Squeeze"})


def weight_scale_warnings(model: ir.Model, inputs: Iterable[str], limit: float,
                          low: Callable[[ir.Node], bool]) -> list[str]:
    """One sentence per graph input in ``inputs`` (float, of unknown range) whose first product, in low
    precision (``low``; one kept FP32 reads the input as it is), has weights that say it takes values past
    ``limit / SCALE_MARGIN`` (module doc), its smallest-weighted feature's."""
    by_name = {v.name: v for v in model.graph.inputs if v.name}
    found = []
    for name in inputs:
        value = by_name.get(name)
        if value is None or value.dtype not in FLOAT_TYPES:
            continue
        for node, weights in _first_products(value):
            if not low(node):
                continue
            who = f"{node.op_type} {node.name!r}" if node.name else node.op_type
            warning = scale_warning(weights, who, name, limit)
            if warning is not None:
                found.append(warning)
                break
    return [text for _, text in sorted(found, key=lambda f: -f[0])]


def scale_warning(weights: np.ndarray, who: str, name: str, limit: float) -> tuple[float, str] | None:
    """The scale the first product ``who`` (its constant weight ``weights`` as ``[features, outputs]``)
    implies for the input ``name``, its smallest-weighted feature's ``1 / max |w|``, and the warning's
    sentence, when that scale is past ``limit / SCALE_MARGIN`` (module doc); None otherwise. The FX
    conversion's check (:mod:`amp_compiler.fx.graph.input_scale`) is this one."""
    peaks = np.max(np.abs(weights), axis=1)
    live = np.flatnonzero(peaks > 0)
    if not live.size:
        return None
    k = int(live[np.argmin(peaks[live])])
    implied = 1.0 / float(peaks[k])
    if implied * SCALE_MARGIN <= limit:
        return None
    return implied, (f"{who} reads feature {k} of input {name!r} with weights of at most {peaks[k]:.2g}: a model "
                     f"trained so takes values near {implied:.2g} there (past {limit:g} / {SCALE_MARGIN:g})")


def _first_products(value: ir.Value) -> list[tuple[ir.Node, np.ndarray]]:
    """The MatMul/Gemm nodes reading ``value`` (through :data:`SAME_VALUES`) as their activation, with
    their constant weight as ``[features, outputs]``."""
    found: list[tuple[ir.Node, np.ndarray]] = []
    stack, seen = [value], set()
    while stack:
        v = stack.pop()
        for node, index in v.uses():
            if id(node) in seen:
                continue
            seen.add(id(node))
            if node.op_type in SAME_VALUES and index == 0 and node.outputs and node.outputs[0].dtype in FLOAT_TYPES:
                stack.append(node.outputs[0])
                continue
            weights = _weights(node, index)
            if weights is not None:
                found.append((node, weights))
    return found


def _weights(node: ir.Node, index: int) -> np.ndarray | None:
    """A MatMul's or Gemm's constant 2-D weight as ``[features, outputs]`` when ``index`` is its activation."""
    if node.op_type not in ("MatMul", "Gemm") or index != 0 or len(node.inputs) < 2:
        return None
    if node.op_type == "Gemm" and bool(node.attributes.get_int("transA", False)):
        return None
    w = node.inputs[1]
    if w is None or not is_constant(w):
        return None
    array = constant_array(w)
    if array is None or array.ndim != 2 or not np.issubdtype(array.dtype, np.floating):
        return None
    array = np.asarray(array, np.float64)
    if node.op_type == "Gemm" and bool(node.attributes.get_int("transB", False)):
        array = array.T
    return array if np.all(np.isfinite(array)) else None
