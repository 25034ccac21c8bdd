"""The numpy home of FP8 numbers: the formats' limits (Target.FP8's for E4M3), saturating quantization
equal to ml_dtypes' cast of the clipped quotient, dequantization rounded once to the scale's type, and
scales within their type's normal range."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from amp_compiler.core.fp8_numbers import Fp8Format, dequantize, quantize, scale_for_amax, stored_scale, weight_scales
from amp_compiler.targets import Target


def test_limits_come_from_the_types():
    assert (Fp8Format.E4M3.max, Fp8Format.E4M3.smallest_normal) == (448.0, 2.0**-6) == (Target.FP8.max,
                                                                                       Target.FP8.smallest_normal)
    assert (Fp8Format.E5M2.max, Fp8Format.E5M2.smallest_normal) == (57344.0, 2.0**-14)
    assert Fp8Format.E4M3.dtype == Target.FP8.numpy_dtype


@pytest.mark.parametrize("fmt", list(Fp8Format), ids=lambda f: f.value)
def test_quantize_saturates_and_rounds_like_the_types_cast(fmt):
    x = np.arange(2**16, dtype=np.uint16).view(np.float16).astype(np.float32)  # every FP16 value
    for scale in (1.0, 0.3701, 2.0**-10):
        got = quantize(x, np.float16(scale), fmt)
        with np.errstate(invalid="ignore", over="ignore"):
            expected = np.clip(x / np.float32(np.float16(scale)), -fmt.max, fmt.max).astype(fmt.dtype)
        nan = np.isnan(x)
        assert np.array_equal(got.view(np.uint8)[~nan], expected.view(np.uint8)[~nan])
        assert np.isnan(got[nan].astype(np.float32)).all()
        assert np.abs(got[~nan].astype(np.float32)).max() == fmt.max  # saturated, never inf


def test_dequantize_rounds_once_to_the_scales_type():
    q = quantize(np.linspace(-448, 448, 97, dtype=np.float32), 1.0)
    assert dequantize(q, np.float16(0.1)).dtype == np.float16
    assert dequantize(q, np.float32(0.1)).dtype == np.float32
    exact = q.astype(np.float32) * np.float32(np.float16(0.1))
    assert np.array_equal(dequantize(q, np.float16(0.1)), exact.astype(np.float16))
    assert dequantize(q, np.float16(0.1), ml_dtypes.bfloat16).dtype == ml_dtypes.bfloat16


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32])
def test_scales_are_normal_values_of_their_type(dtype):
    info = ml_dtypes.finfo(dtype)
    amax = np.array([0.0, -1.0, np.nan, np.inf, 1e-45, 1e-30, 3.0, 448.0, 3e38])
    scales = scale_for_amax(amax, margin=1, dtype=dtype).astype(np.float64)
    assert scales.dtype == np.float64 and np.all(np.isfinite(scales))
    assert np.all(scales >= float(info.smallest_normal)) and np.all(scales <= float(info.max))
    assert list(scales[:4]) == [1.0] * 4 and scales[7] == 2.0  # nothing to scale: 1; 448 * 2 / 448
    assert stored_scale(1e-40, dtype) == np.asarray(info.smallest_normal, dtype=dtype)  # below every normal


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_weight_scales_per_channel_and_per_tensor(dtype):
    """``amax / 448`` per output channel in float64, rounded through float32 to the type (as the ONNX
    path's scales always were)."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((16, 8, 3, 3)) * rng.uniform(1e-3, 30, (16, 1, 1, 1))).astype(np.float32)
    w[5] = 0.0
    per_channel = weight_scales(w, 0, dtype=dtype)
    amax = np.abs(w).reshape(16, -1).max(axis=1)
    for c in range(16):
        expected = 1.0 if amax[c] == 0 else max(float(amax[c]) / 448.0, float(ml_dtypes.finfo(dtype).smallest_normal))
        assert per_channel[c] == np.asarray(expected, dtype=np.float32).astype(dtype)
    assert weight_scales(w, None, dtype=dtype) == np.asarray(float(amax.max()) / 448.0, np.float32).astype(dtype)
    assert weight_scales(w, None, dtype=dtype).shape == () and per_channel.dtype == dtype
