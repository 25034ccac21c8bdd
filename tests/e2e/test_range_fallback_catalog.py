"""The range fallback on the catalog entries whose values leave FP16's range (issue 26): FP16 with
scaled-FP16 and BF16 fallbacks against FP16 with FP32 fallbacks and all-BF16, under exact emulation."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from amp_compiler import convert
from amp_compiler.onnx.measure.calibrate import collect_ranges
from benchmarks.range_fallback_table import CASES, _inputs, rows
from models import catalog

_rows = functools.cache(rows)  # each case's conversions and measures, once for the tests below


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_mixed_fp16_bf16_is_finite_beats_all_bf16_and_keeps_tensor_cores_low(case):
    by_way = {r.way: r for r in _rows(case)}
    mixed, fp32_fallback = by_way["fp16 + bf16 fallbacks"], by_way["fp16 + fp32 fallbacks"]
    all_bf16, trt = by_way["all bf16"], by_way["tensorrt: fp16 + bf16 fallbacks"]
    assert mixed.finite and trt.finite
    # as accurate as all-BF16 at least, and within 2x of FP32 fallbacks (BF16 GEMMs against FP32 ones)
    assert mixed.error <= max(all_bf16.error, fp32_fallback.error)
    assert mixed.error <= 2 * fp32_fallback.error and trt.error < 1e-2
    # no Tensor Core FLOPs left in FP32 where a BF16 kernel exists (the Convs here are below opset 22,
    # where onnx's Conv takes no BF16: they stay FP32 on every provider)
    assert mixed.fp32_tc <= fp32_fallback.fp32_tc and trt.fp32_tc <= fp32_fallback.fp32_tc
    if case.name == "llama-massive-activations-small":
        assert mixed.fp32_tc == trt.fp32_tc == 0.0 < fp32_fallback.fp32_tc
        assert mixed.error < all_bf16.error / 5  # most values fit FP16: mixed clearly beats all-BF16
        assert not by_way["fp16, no range information"].finite


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_scaled_fp16_fallbacks_leave_no_tensor_core_flop_in_fp32(case):
    """The default on the GPU providers: range-pinned MatMul/Gemm/Conv in FP16 on power-of-two scaled
    operands where the observed ranges allow it (Convs below opset 22 included, which have no BF16),
    BF16 where they do not. Finite, well within all-BF16's error, every Tensor Core FLOP low."""
    by_way = {r.way: r for r in _rows(case)}
    all_bf16 = by_way["all bf16"]
    for way in ("fp16 + scaled fp16 fallbacks (then bf16)", "tensorrt: fp16 + scaled fp16 fallbacks (then bf16)"):
        scaled = by_way[way]
        assert scaled.finite, way
        assert scaled.fp32_tc == 0.0, way
        assert scaled.error <= all_bf16.error / 5 or scaled.error == all_bf16.error == 0.0, way
    scaled, bf16 = by_way["fp16 + scaled fp16 fallbacks (then bf16)"], by_way["fp16 + bf16 fallbacks"]
    if bf16.fp32_tc == 0.0:  # BF16 took every range-pinned op: a shift costs no more than BF16 would
        assert scaled.error <= bf16.error * 1.05
    else:  # no BF16 kernel (Convs below opset 22): FP16's own cost of the FLOPs it moves off FP32
        assert scaled.error <= 3 * by_way["fp16 + fp32 fallbacks"].error


def test_the_decoders_projections_scaled_per_channel_are_as_accurate_as_fp32_ones():
    """Massive activations lie in a few channels: both overflowing down projections run in FP16 scaled
    per channel (only those channels shifted), and the decoder is within 1% of FP16 with FP32
    fallbacks on both providers (one shift per tensor left one projection in BF16: 4.9% more)."""
    case = next(c for c in CASES if c.name == "llama-massive-activations-small")
    by_way = {r.way: r for r in _rows(case)}
    for prefix in ("", "tensorrt: "):
        scaled, fp32 = by_way[f"{prefix}fp16 + scaled fp16 fallbacks (then bf16)"], by_way[f"{prefix}fp16 + fp32 fallbacks"]
        assert scaled.fp32_tc == 0.0 < fp32.fp32_tc
        assert scaled.error <= 1.01 * fp32.error, prefix
    fp32_model = catalog.load(case.name)
    ranges = collect_ranges(fp32_model, [_inputs(case, 1000 + k) for k in range(2)])
    result = convert(fp32_model, provider="cuda", ranges=ranges)
    projections = [d for d in result.decisions if d.op_type == "MatMul" and d.rule == "calibration.overflow"]
    assert len(projections) == 2
    assert all(d.precision == "fp16" and "per channel" in d.reason for d in projections)
    assert not any(d.precision == "bf16" for d in result.decisions)
    assert np.isfinite([by_way["fp16 + scaled fp16 fallbacks (then bf16)"].error]).all()


def test_fp32_fallbacks_as_the_gpu_runs_them_and_the_audio_front_ends_gap():
    """onnxruntime's CUDA provider and TensorRT run FP32 GEMMs on Tensor Cores as TF32 by default, their
    operands rounded to FP16's 10 mantissa bits: the int16 audio front end's FP32 fallbacks (96.5% of its
    Tensor Core FLOPs) measure more error so (6.96e-4 against 6.43e-4 exact, ten held-out samples). The
    scaled FP16 default, no FLOP in FP32, stays within 1.4x of exact FP32 fallbacks and 1.3x of TF32 ones
    (8.58e-4): what is left is FP16's rounding of the products' outputs, which an FP32 output does not
    have (and no ONNX product of FP16 operands writes FP32). Where nothing runs in FP32, TF32 changes
    nothing."""
    audio = {r.way: r for r in _rows(next(c for c in CASES if c.name == "stft-power-mel"))}
    for prefix in ("", "tensorrt: "):
        fp32, scaled = audio[f"{prefix}fp16 + fp32 fallbacks"], audio[f"{prefix}fp16 + scaled fp16 fallbacks (then bf16)"]
        assert fp32.error_tf32 > fp32.error
        assert scaled.fp32_tc == 0.0 and scaled.error_tf32 == scaled.error
        assert scaled.error <= 1.4 * fp32.error and scaled.error <= 1.3 * fp32.error_tf32
    decoder = {r.way: r for r in _rows(next(c for c in CASES if c.name == "llama-massive-activations-small"))}
    scaled = decoder["fp16 + scaled fp16 fallbacks (then bf16)"]
    assert scaled.fp32_tc == 0.0 and scaled.error_tf32 == scaled.error
