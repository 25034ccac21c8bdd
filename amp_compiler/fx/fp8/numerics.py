"""FP8 arithmetic in torch: saturating casts, scales, and the FP8 matrix product (``torch._scaled_mm``
on a GPU that has FP8 Tensor Cores, an exact emulation elsewhere).

Conventions and numbers are :mod:`amp_compiler.core.fp8_numbers`'s (the ONNX path's too): a scale
``s`` is a *dequantization* scale, FP32 here: ``q = saturate(x / s)`` (a float32 division), ``x ~ q *
s``; ``s = amax * 2^margin / fp8_max``. (Transformer Engine stores the reciprocal as its ``scale``
and multiplies; ``s`` is its ``scale_inv``, and what ``torch._scaled_mm`` takes.) The formats' limits
come from there (:class:`~amp_compiler.core.fp8_numbers.Fp8Format`; :func:`torch_dtype` is its torch
type), scales are computed there; the casts and the GEMM are torch kernels (they run in the
converted graph, on the GPU), held to the numpy home's bits by ``tests/fx/fp8/test_numerics.py``.

Guarantees:
- :func:`saturating_cast` gives, bit for bit, ml_dtypes' cast of the value clipped to the format's
  finite range: round to nearest even (subnormals included), +-inf and values beyond the largest
  finite value saturate to it, NaN stays NaN, the sign of zero is kept. torch's own casts do not
  agree with that or with each other (torch 2.13's cast to ``float8_e4m3fn`` saturates, earlier
  versions and ml_dtypes give NaN; its cast to ``float8_e5m2`` gives inf), so every cast clips first.
- :func:`fp8_matmul` computes ``(q_a @ q_b) * s_a * s_b (+ bias)`` with FP8 products exact and FP32
  accumulation, then rounds once to ``out_dtype``: what an FP8 Tensor Core GEMM computes (up to the
  order of the FP32 sums). On CUDA with compute capability >= 8.9 and dims ``torch._scaled_mm``
  takes, that call runs; the same function on other devices runs the emulation.
"""

from __future__ import annotations

import numpy as np
import torch

from amp_compiler.core import fp8_numbers
from amp_compiler.core.fp8_numbers import Fp8Format

__all__ = ["channel_scales", "dequantize", "fp8_gemm", "fp8_matmul", "has_fp8_tensor_cores", "quantize",
           "saturating_cast", "scale_for_amax", "scaled_mm_2d", "torch_dtype"]

_TORCH_DTYPES = {Fp8Format.E4M3: torch.float8_e4m3fn, Fp8Format.E5M2: torch.float8_e5m2}


def torch_dtype(fmt: Fp8Format) -> torch.dtype:
    """The torch type of an FP8 format (:class:`amp_compiler.core.fp8_numbers.Fp8Format`)."""
    return _TORCH_DTYPES[fmt]


def saturating_cast(x: torch.Tensor, fmt: Fp8Format) -> torch.Tensor:
    """``x`` (any float type) as ``fmt``: clipped to +-max in float32, then cast (see module doc)."""
    limit = fmt.max
    return torch.clamp(x.to(torch.float32), -limit, limit).to(torch_dtype(fmt))


def quantize(x: torch.Tensor, scale: torch.Tensor, fmt: Fp8Format = Fp8Format.E4M3) -> torch.Tensor:
    """``saturate(x / scale)`` in ``fmt``: ``x`` widened to float32 and divided by the FP32 ``scale``
    (a scalar, or a tensor that broadcasts against ``x``)."""
    return saturating_cast(x.to(torch.float32) / scale.to(torch.float32), fmt)


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``q * scale`` computed in float32, then ``dtype``."""
    return (q.to(torch.float32) * scale.to(torch.float32)).to(dtype)


def scale_for_amax(amax: float, fmt: Fp8Format = Fp8Format.E4M3, margin: int = 0) -> float:
    """The FP32 scale that maps ``amax * 2^margin`` to the format's largest value; 1.0 for an amax of 0
    or not finite (nothing to scale), and never below FP32's smallest normal
    (:func:`amp_compiler.core.fp8_numbers.scale_for_amax`)."""
    return float(fp8_numbers.scale_for_amax(amax, fmt, margin, np.float32))


def channel_scales(weight: torch.Tensor, axis: int, fmt: Fp8Format = Fp8Format.E4M3) -> torch.Tensor:
    """FP32 scales ``amax / fp8_max`` per slice along ``axis`` (an output channel), margin 0: a
    weight's values are known exactly. A channel of zeros gets 1
    (:func:`amp_compiler.core.fp8_numbers.weight_scales`)."""
    w = weight.detach().to(device="cpu", dtype=torch.float32).numpy()
    scales = fp8_numbers.weight_scales(w, axis, fmt, np.float32)
    return torch.from_numpy(scales).to(weight.device)


def has_fp8_tensor_cores(device: torch.device) -> bool:
    """True for a CUDA device of compute capability 8.9 or later (Ada, Hopper and newer)."""
    return device.type == "cuda" and torch.cuda.is_available() and torch.cuda.get_device_capability(device) >= (8, 9)


def _scaled_mm_takes(a: torch.Tensor, b_t: torch.Tensor) -> bool:
    """Whether ``torch._scaled_mm`` takes these operands: 2-D, K and N multiples of 16."""
    return a.ndim == 2 and b_t.ndim == 2 and a.shape[1] % 16 == 0 and b_t.shape[0] % 16 == 0


def scaled_mm_2d(
    a: torch.Tensor, scale_a: torch.Tensor, b_t: torch.Tensor, scale_b: torch.Tensor
) -> torch.Tensor:
    """``(a @ b_t.T) * scale_a * scale_b`` in FP32 through ``torch._scaled_mm`` (a [M, K], b_t [N, K],
    both FP8; ``scale_a`` per tensor; ``scale_b`` per tensor or one per output column N): the scales
    of ``torch._scaled_mm`` are per tensor here, so per-column scales multiply its FP32 result."""
    one = torch.ones((), dtype=torch.float32, device=a.device)
    per_tensor_b = scale_b.numel() == 1
    y = torch._scaled_mm(
        a.contiguous(), b_t.contiguous().t(), scale_a=scale_a.reshape(()).to(torch.float32),
        scale_b=scale_b.reshape(()).to(torch.float32) if per_tensor_b else one, out_dtype=torch.float32,
    )
    return y if per_tensor_b else y * scale_b.reshape(1, -1).to(torch.float32)


def _emulated(a: torch.Tensor, scale_a: torch.Tensor, b_t: torch.Tensor, scale_b: torch.Tensor) -> torch.Tensor:
    """``(a @ b_t.mT) * scale_a * scale_b`` in FP32: FP8 values widen exactly, their products are
    exact in FP32 (8 significant bits), sums are FP32, the scales multiply the result."""
    y = torch.matmul(a.to(torch.float32), b_t.to(torch.float32).mT)
    scale_b = scale_b.to(torch.float32)
    return y * scale_a.to(torch.float32) * (scale_b.reshape(-1) if scale_b.numel() > 1 else scale_b)


def fp8_matmul(
    a: torch.Tensor, scale_a: torch.Tensor, b_t: torch.Tensor, scale_b: torch.Tensor,
    bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.float16,
) -> torch.Tensor:
    """``a @ b_t.mT`` of FP8 operands with their scales, plus ``bias``, as ``out_dtype``.

    ``a`` [..., M, K] and ``b_t`` [..., N, K] (the second operand transposed: a linear layer's
    weight as it is stored) broadcast like ``torch.matmul``; ``scale_a`` per tensor, ``scale_b`` per
    tensor or one per N. The bias is added in FP32 before the one rounding to ``out_dtype``.
    """
    if has_fp8_tensor_cores(a.device):
        lead = a.shape[:-1]
        a2 = a.reshape(-1, a.shape[-1])
        if b_t.ndim == 2 and _scaled_mm_takes(a2, b_t):
            y = scaled_mm_2d(a2, scale_a, b_t, scale_b).reshape(*lead, b_t.shape[0])
        elif a.ndim > 2 and a.shape[:-2] == b_t.shape[:-2] and _scaled_mm_takes(a[(0,) * (a.ndim - 2)],
                                                                                  b_t[(0,) * (b_t.ndim - 2)]):
            # a batch of matrix products (attention): one torch._scaled_mm per matrix
            pairs = zip(a.reshape(-1, *a.shape[-2:]), b_t.reshape(-1, *b_t.shape[-2:]), strict=True)
            y = torch.stack([scaled_mm_2d(x, scale_a, w, scale_b) for x, w in pairs])
            y = y.reshape(*a.shape[:-1], b_t.shape[-2])
        else:
            y = _emulated(a, scale_a, b_t, scale_b)
    else:
        y = _emulated(a, scale_a, b_t, scale_b)
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(out_dtype)


def fp8_gemm(
    a: torch.Tensor, scale_a: torch.Tensor, b: torch.Tensor, scale_b: torch.Tensor, bias: torch.Tensor | None = None,
    *, b_transposed: bool = True, out_dtype: torch.dtype = torch.float16,
) -> torch.Tensor:
    """The FP8 GEMM as a node of a converted graph calls it: :func:`fp8_matmul` with the second
    operand given as [..., N, K] (``b_transposed``, a stored weight) or as [..., K, N]."""
    return fp8_matmul(a, scale_a, b if b_transposed else b.mT, scale_b, bias, out_dtype)
