"""FP8 numbers in numpy: the E4M3 and E5M2 formats' limits, Q/DQ's quantization and dequantization,
and scales from an amax. The one home of these numbers and formulas: the ONNX path computes with
them, the FX path's torch kernels take their constants from here and its scales are computed here
(``tests/fx/fp8/test_numerics.py`` holds the two to the same bits).

Conventions: a scale ``s`` is a *dequantization* scale: ``q = saturate(x / s)`` (a float32 division),
``x ~ q * s``; ``s = amax * 2^margin / fmt.max``, stored in the type that holds it (the ONNX Q/DQ
nodes' FP16 or BF16, the FX path's FP32).

Guarantees:
- :class:`Fp8Format` reads its limits from ml_dtypes' types; E4M3's is :attr:`amp_compiler.targets.Target.FP8`'s.
- :func:`quantize` is what QuantizeLinear to float8 with ``saturate=1`` computes (onnxruntime, and
  TensorRT's explicit quantization): ``x / scale`` in float32 (a division, not a multiplication by
  1/scale), clipped to +-max, rounded to nearest even, ties to even also among subnormals; NaN stays
  NaN, the sign of zero is kept.
- :func:`dequantize` is what DequantizeLinear computes: ``q * scale`` in float32, rounded once to the
  scale's type (or the one given).
- every scale from :func:`scale_for_amax` and :func:`weight_scales` is a value of its type within its
  normal range, never 0, inf or NaN; an amax of 0 or not finite gives 1 (nothing to scale).
"""

from __future__ import annotations

import enum

import ml_dtypes
import numpy as np

from amp_compiler.targets import Target

__all__ = ["Fp8Format", "dequantize", "quantize", "scale_for_amax", "stored_scale", "weight_scales"]


class Fp8Format(enum.Enum):
    """The two FP8 formats of Hopper's Tensor Cores (Transformer Engine's names for them)."""

    E4M3 = "e4m3"  # float8_e4m3fn: max 448, smallest normal 2^-6, 3 mantissa bits (forward tensors)
    E5M2 = "e5m2"  # float8_e5m2: max 57344, smallest normal 2^-14, 2 mantissa bits (gradients)

    @property
    def dtype(self) -> np.dtype:
        return Target.FP8.numpy_dtype if self is Fp8Format.E4M3 else np.dtype(ml_dtypes.float8_e5m2)

    @property
    def max(self) -> float:
        """Largest finite value."""
        return float(ml_dtypes.finfo(self.dtype).max)

    @property
    def smallest_normal(self) -> float:
        return float(ml_dtypes.finfo(self.dtype).smallest_normal)


def quantize(x: np.ndarray, scale: np.ndarray | float, fmt: Fp8Format = Fp8Format.E4M3) -> np.ndarray:
    """``saturate(x / scale)`` in ``fmt`` (see module doc). ``scale`` broadcasts against ``x``
    (per-axis scales: reshape first)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        scaled = np.asarray(x, dtype=np.float32) / np.asarray(scale, dtype=np.float32)
    return np.clip(scaled, -fmt.max, fmt.max).astype(fmt.dtype)


def dequantize(q: np.ndarray, scale: np.ndarray | float, dtype: np.dtype | type | None = None) -> np.ndarray:
    """``q * scale`` in float32, rounded once to ``dtype`` (default: the scale's type, as
    DequantizeLinear's output has it)."""
    scale = np.asarray(scale)
    out = np.asarray(q).astype(np.float32) * scale.astype(np.float32)
    return out.astype(scale.dtype if dtype is None else dtype)


def stored_scale(value: np.ndarray | float, dtype: np.dtype | type = np.float32) -> np.ndarray:
    """``value`` (float64, elementwise) as a scale of ``dtype``: 1 where it is not finite or not
    positive, clamped to the type's normal range, rounded through float32."""
    raw = np.asarray(value, dtype=np.float64)
    raw = np.where(np.isfinite(raw) & (raw > 0), raw, 1.0)
    info = ml_dtypes.finfo(dtype)
    clamped = np.clip(raw, float(info.smallest_normal), float(info.max))
    return clamped.astype(np.float32).astype(dtype)


def scale_for_amax(
    amax: np.ndarray | float, fmt: Fp8Format = Fp8Format.E4M3, margin: int = 0, dtype: np.dtype | type = np.float32
) -> np.ndarray:
    """The scale that maps ``amax * 2^margin`` to ``fmt``'s largest value, in ``dtype`` (elementwise;
    see module doc)."""
    return stored_scale(np.asarray(amax, dtype=np.float64) * 2.0**margin / fmt.max, dtype)


def weight_scales(
    weight: np.ndarray, axis: int | None, fmt: Fp8Format = Fp8Format.E4M3, dtype: np.dtype | type = np.float32
) -> np.ndarray:
    """A weight's scales ``amax / fmt.max`` (margin 0: its values are known exactly) per slice along
    ``axis`` (an output channel), or one for the tensor (``axis`` None: a 0-d array), in ``dtype``."""
    magnitude = np.abs(np.asarray(weight))
    if axis is None:
        return scale_for_amax(float(np.max(magnitude, initial=0.0)), fmt, 0, dtype)
    others = tuple(d for d in range(magnitude.ndim) if d != axis)
    amax = np.max(magnitude, axis=others, initial=0.0) if others else magnitude
    return scale_for_amax(np.ravel(amax), fmt, 0, dtype)
