"""FP8 arithmetic of the FX path (amp_compiler.fx.fp8.numerics): casts bit for bit against ml_dtypes,
scales, and the FP8 matrix product against its definition and torch._scaled_mm."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

from amp_compiler.core import fp8_numbers
from amp_compiler.core.fp8_numbers import Fp8Format
from amp_compiler.fx.fp8.numerics import (
    channel_scales,
    dequantize,
    fp8_matmul,
    has_fp8_tensor_cores,
    quantize,
    saturating_cast,
    scale_for_amax,
    scaled_mm_2d,
    torch_dtype,
)
from amp_compiler.targets import Target

ML = {Fp8Format.E4M3: ml_dtypes.float8_e4m3fn, Fp8Format.E5M2: ml_dtypes.float8_e5m2}


def _fp8_values(fmt: Fp8Format) -> np.ndarray:
    """Every finite value of the format, as float32, in increasing order."""
    v = np.arange(256, dtype=np.uint8).view(ML[fmt]).astype(np.float32)
    return np.unique(v[np.isfinite(v)])


def _inputs_of_interest(fmt: Fp8Format) -> np.ndarray:
    """float32 inputs: every FP16 value; a sweep of every 4096th float32 bit pattern (all exponents,
    signs, NaN payloads); every FP8 value, the midpoints between neighbours (the ties) and the float32
    values one ulp either side of them; values at and beyond the largest finite value; inf, NaN, -0."""
    fp16 = np.arange(2**16, dtype=np.uint16).view(np.float16).astype(np.float32)
    sweep = (np.arange(2**20, dtype=np.uint64) << np.uint64(12)).astype(np.uint32).view(np.float32)
    vals = _fp8_values(fmt)
    mids = ((vals[1:].astype(np.float64) + vals[:-1]) / 2).astype(np.float32)  # exact in float32
    near = np.concatenate([np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(-np.inf))])
    top = np.float32(fmt.max)
    beyond = np.array([top, np.nextafter(top, np.float32(np.inf)), top * 1.0625, top * 1.0625 + 1, top * 2,
                       1e30, np.finfo(np.float32).max, np.inf, -np.inf, np.nan, -np.nan, 0.0, -0.0], dtype=np.float32)
    payload_nans = np.array([0x7FC00001, 0xFFC00000, 0x7F800001, 0xFF812345], dtype=np.uint32).view(np.float32)
    parts = [fp16, sweep, vals, mids, near, beyond, -beyond, payload_nans]
    return np.concatenate([p.astype(np.float32) for p in parts])


def _reference(x: np.ndarray, fmt: Fp8Format) -> np.ndarray:
    """ml_dtypes' cast of the value clipped to the finite range (NaN passes np.clip as NaN)."""
    with np.errstate(invalid="ignore"):
        return np.clip(x, -fmt.max, fmt.max).astype(ML[fmt])


def _bits(t: torch.Tensor) -> np.ndarray:
    return t.view(torch.uint8).numpy()


def _same_bits_or_both_nan(ours: np.ndarray, ref: np.ndarray, fmt: Fp8Format) -> None:
    ref_bits = ref.view(np.uint8)
    nan = np.isnan(ref.astype(np.float32))
    assert np.array_equal(np.isnan(ours.view(ML[fmt]).astype(np.float32)), nan)
    wrong = np.flatnonzero((ours != ref_bits) & ~nan)
    assert wrong.size == 0, f"{wrong.size} values differ, e.g. index {wrong[:5]}"


@pytest.mark.parametrize("fmt", list(Fp8Format), ids=lambda f: f.value)
def test_saturating_cast_equals_ml_dtypes_bit_for_bit(fmt):
    x = _inputs_of_interest(fmt)
    ours = _bits(saturating_cast(torch.from_numpy(x), fmt))
    ref = _reference(x, fmt)
    _same_bits_or_both_nan(ours, ref, fmt)
    # NaN keeps its sign bit. E4M3 has one NaN per sign, so its bits match too; E5M2 has three, and
    # torch always writes 0x7f (sign set: 0xff) where ml_dtypes keeps the top bits of the payload.
    nan = np.isnan(x)
    assert np.array_equal(ours[nan] >> 7, np.signbit(x[nan]).astype(np.uint8))
    if fmt is Fp8Format.E4M3:
        assert np.array_equal(ours[nan], ref.view(np.uint8)[nan])
    else:
        assert set(np.unique(ours[nan] & 0x7F).tolist()) == {0x7F}


@pytest.mark.parametrize("fmt", list(Fp8Format), ids=lambda f: f.value)
def test_saturation_rounding_and_signed_zero(fmt):
    top = fmt.max
    x = torch.tensor([top, top * 1.03, top * 1.0625, top * 4, float("inf"), -float("inf"), -0.0, float("nan")])
    got = saturating_cast(x, fmt).to(torch.float32)
    assert got[:4].tolist() == [top] * 4 and got[4].item() == top and got[5].item() == -top
    assert got[6].item() == 0.0 and torch.signbit(got[6]) and torch.isnan(got[7])
    # ties go to even, also among subnormals: the midpoint of the two smallest subnormals -> the even one
    tiny = float(torch.finfo(torch_dtype(fmt)).smallest_normal) / (8 if fmt is Fp8Format.E4M3 else 4)
    mids = torch.tensor([0.5 * tiny, 1.5 * tiny, 2.5 * tiny], dtype=torch.float32)
    assert saturating_cast(mids, fmt).to(torch.float32).tolist() == [0.0, 2 * tiny, 2 * tiny]


def test_the_raw_casts_disagree_hence_the_clip():
    """Why every cast clips first: without it ml_dtypes gives NaN for an E4M3 overflow and torch's
    E5M2 cast gives inf, where the saturating cast gives the largest finite value."""
    big = np.array([1000.0, np.inf], dtype=np.float32)
    assert np.isnan(big.astype(ml_dtypes.float8_e4m3fn).astype(np.float32)).all()
    assert torch.isinf(torch.tensor([1e6]).to(torch.float8_e5m2).float()).all()
    assert saturating_cast(torch.from_numpy(big), Fp8Format.E4M3).float().tolist() == [448.0, 448.0]
    assert saturating_cast(torch.tensor([1e6]), Fp8Format.E5M2).float().item() == 57344.0


def test_formats_are_targets_numbers():
    assert Fp8Format.E4M3.max == Target.FP8.max == 448.0
    assert Fp8Format.E4M3.smallest_normal == Target.FP8.smallest_normal == 2.0**-6
    assert Fp8Format.E5M2.max == 57344.0 and Fp8Format.E5M2.smallest_normal == 2.0**-14


@pytest.mark.parametrize("fmt", list(Fp8Format), ids=lambda f: f.value)
@pytest.mark.parametrize("scale", [1.0, 0.0078125, 0.3701, 3.5, 1e-30])
@pytest.mark.parametrize("source", [torch.float16, torch.float32])
def test_quantize_equals_the_onnx_paths_quantize_linear(scale, source, fmt):
    """The FX path quantizes as the ONNX path's QuantizeLinear (x / s in float32, saturate), the numpy
    home's :func:`amp_compiler.core.fp8_numbers.quantize`: same bits on every FP16 value and the float32 sweep."""
    x = torch.from_numpy(_inputs_of_interest(fmt)).to(source)
    s = torch.tensor(scale, dtype=torch.float32)
    ours = _bits(quantize(x, s, fmt))
    ref = fp8_numbers.quantize(x.to(torch.float32).numpy(), np.float32(scale), fmt)
    _same_bits_or_both_nan(ours, ref, fmt)


def test_dequantize_and_scales_are_the_numpy_homes():
    """Dequantization and scales give the numpy home's bits (its constants: the formats' limits)."""
    for fmt in Fp8Format:  # the torch types' limits are the numpy home's
        assert (torch.finfo(torch_dtype(fmt)).max, torch.finfo(torch_dtype(fmt)).smallest_normal) == (
            fmt.max, fmt.smallest_normal)
    q = quantize(torch.linspace(-500, 500, 1001), torch.tensor(0.37))
    for dtype, np_dtype in ((torch.float32, np.float32), (torch.float16, np.float16)):
        got = dequantize(q, torch.tensor(0.37), dtype).numpy()
        ref = fp8_numbers.dequantize(q.view(torch.uint8).numpy().view(ML[Fp8Format.E4M3]), np.float32(0.37), np_dtype)
        assert np.array_equal(got.view(np.uint8), ref.view(np.uint8))
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((48, 32)) * rng.uniform(1e-6, 1e4, (48, 1))).astype(np.float32)
    w[3] = 0.0
    for axis in (0, 1):
        got = channel_scales(torch.from_numpy(w), axis).numpy()
        # the per-channel formula in float32 arithmetic, as torch computed it before: the same bits
        others = 1 - axis
        amax = np.abs(w).max(axis=others)
        direct = np.where(amax > 0, np.maximum(amax / np.float32(448.0), np.finfo(np.float32).tiny), 1.0)
        assert np.array_equal(got, direct.astype(np.float32))
        assert np.array_equal(got, fp8_numbers.weight_scales(w, axis))
    for amax in (0.0, 1e-30, 3.0, 448.0, 1e30, float("inf")):
        for margin in (0, 1, 3):
            assert scale_for_amax(amax, Fp8Format.E4M3, margin) == float(fp8_numbers.scale_for_amax(amax, margin=margin))


def test_dequantize_and_scales():
    q = saturating_cast(torch.tensor([448.0, -3.0, 0.015625]), Fp8Format.E4M3)
    assert dequantize(q, torch.tensor(0.5)).tolist() == [224.0, -1.5, 0.0078125]
    assert scale_for_amax(448.0) == 1.0 and scale_for_amax(448.0, margin=1) == 2.0
    assert scale_for_amax(57344.0, Fp8Format.E5M2) == 1.0
    assert scale_for_amax(0.0) == scale_for_amax(float("inf")) == scale_for_amax(float("nan")) == 1.0
    w = torch.tensor([[1.0, -896.0], [0.0, 0.0], [0.25, 0.1]])
    assert channel_scales(w, 0).tolist() == pytest.approx([2.0, 1.0, 0.25 / 448])
    assert channel_scales(w, 1).tolist() == pytest.approx([1.0 / 448, 2.0])
    assert torch.equal(quantize(w, channel_scales(w, 0).reshape(-1, 1)).float().abs().amax(1),
                       torch.tensor([448.0, 0.0, 448.0]))


def _operands(m=32, k=64, n=48, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g) * 3
    w = torch.randn(n, k, generator=g) * 0.05
    sa = torch.tensor(scale_for_amax(a.abs().max().item()))
    sw = channel_scales(w, 0)
    return quantize(a, sa), sa, quantize(w, sw.reshape(-1, 1)), sw


def test_fp8_matmul_is_its_definition():
    """Products of FP8 values in float64 (exact), summed, scaled, rounded once: the FP32 emulation
    agrees to FP32 accumulation error, and its output type is the one asked for."""
    a8, sa, w8, sw = _operands()
    exact = (a8.double() @ w8.double().T) * sa.double() * sw.double()
    y32 = fp8_matmul(a8, sa, w8, sw, out_dtype=torch.float32)
    assert torch.allclose(y32.double(), exact, rtol=1e-6, atol=1e-6 * exact.abs().max().item())
    bias = torch.randn(48)
    y16 = fp8_matmul(a8, sa, w8, sw, bias, out_dtype=torch.float16)
    assert y16.dtype == torch.float16
    assert torch.equal(y16, (y32 + bias).to(torch.float16))
    # batched operands broadcast like torch.matmul (attention: [B, H, T, D] @ [B, H, D, T])
    g = torch.Generator().manual_seed(1)
    q = quantize(torch.randn(2, 3, 5, 16, generator=g), torch.tensor(0.01))
    k = quantize(torch.randn(2, 3, 7, 16, generator=g), torch.tensor(0.02))
    y = fp8_matmul(q, torch.tensor(0.01), k, torch.tensor(0.02), out_dtype=torch.float32)
    ref = (q.double() @ k.double().mT) * 0.01 * 0.02
    assert y.shape == (2, 3, 5, 7) and torch.allclose(y.double(), ref, rtol=1e-6, atol=1e-9)


def test_the_scaled_mm_call_computes_the_emulation():
    """The call the GPU branch makes (torch._scaled_mm, per-tensor scales, per-column weight scales
    applied to its FP32 result) gives the emulation's numbers, on torch's CPU kernel of it. (Which
    branch runs is decided by the device; no FP8 GPU was available to run that branch.)"""
    a8, sa, w8, sw = _operands()
    for scale_w in (sw, torch.tensor(0.125)):  # per output column, per tensor
        emulated = fp8_matmul(a8, sa, w8, scale_w, out_dtype=torch.float32)
        called = scaled_mm_2d(a8, sa, w8, scale_w)
        assert torch.allclose(called, emulated, rtol=0, atol=1e-6 * emulated.abs().max().item())
    assert not has_fp8_tensor_cores(torch.device("cpu"))
