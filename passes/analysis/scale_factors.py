"""Quantization scales: constants that multiply every value an op dequantizes, judged value by value.

:class:`~amp_compiler.passes.analysis.constants.ConstantRangePass` judges a constant as a tensor: its
tiny values may flush to zero where they are negligible beside its largest. A scale (the policy
table's ``scale_inputs``: DequantizeLinear's ``x_scale``) is no such tensor: each of its values is the
factor of a whole block, channel or tensor of dequantized values, so a value's own relative error is
the error of every value it dequantizes, however large its neighbours. In the target's normal range
that error is at most the target's unit rounding (FP16: 2^-11, 0.049%); below it (FP16: 6.1e-5) the
spacing stays 2^-24 and the error grows to 100% near 6e-8. :func:`scale_verdict` finds the values whose
rounding to the target moves them by more than its unit rounding (a scale of 1e-6: up to 3%), and the
constants pass keeps their reader FP32 (``constant.underflow``). Values that convert within the unit
rounding (every normal one, a subnormal that happens to be exact) pass; zeros, infinities and NaNs
are no scales to judge.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx_ir as ir

from amp_compiler.core.plan import Rule
from amp_compiler.onnx.ir.constants import constant_array
from amp_compiler.onnx.ir.walk import is_constant
from amp_compiler.targets import Target

__all__ = ["scale_constants", "scale_verdict"]


def scale_constants(node: ir.Node | None, positions: tuple[int, ...]) -> list[ir.Value]:
    """The FP32 constants the node reads at its scale inputs ``positions`` (present, in order)."""
    if node is None:
        return []
    inputs = node.inputs
    return [v for i in positions if i < len(inputs) and (v := inputs[i]) is not None
            and v.dtype is ir.DataType.FLOAT and is_constant(v)]


def scale_verdict(value: ir.Value, target: Target) -> tuple[Rule, str] | None:
    """``constant.underflow`` and why, when converting the scale ``value`` to ``target`` moves some of
    its values by more than the target's unit rounding (relative to each value); None otherwise."""
    if target not in (Target.FP16, Target.BF16):
        return None
    array = constant_array(value)
    if array is None:
        return None
    arr = np.asarray(array, dtype=np.float64).reshape(-1)
    arr = arr[np.isfinite(arr) & (arr != 0)]
    if not arr.size:
        return None
    with np.errstate(over="ignore", under="ignore"):
        low = arr.astype(np.float32).astype(target.numpy_dtype).astype(np.float64)
    unit = float(ml_dtypes.finfo(target.numpy_dtype).eps) / 2
    relative = np.abs(low - arr) / np.abs(arr)
    lost = relative > unit
    if not lost.any():
        return None
    name = target.value.upper()
    return (
        Rule.CONSTANT_UNDERFLOW,
        f"FP32: constant {value.name!r} is a quantization scale with {int(lost.sum())} value(s) down to "
        f"|x| = {float(np.abs(arr[lost]).min()):.3g}, below {name}'s normal range ({target.smallest_normal:.2g}): "
        f"in {name} they move by up to {100 * float(relative[lost].max()):.2g}% (its own rounding: "
        f"{100 * unit:.2g}%), and every value they dequantize with them",
    )
