"""A 4-bit block-quantized weight-only model (``DequantizeLinear(uint4 [K, N], scale [K/32, N], axis 0,
block_size 32) -> MatMul``, opset 21: onnxruntime's int4 quantizer, ModelOpt INT4-AWQ) converted end to end: the
DQ feeds its FP16 MatMul directly with an FP16 scale, onnxruntime fuses the pair into MatMulNBits, and the
output under exact FP16 emulation is as close to FP32 as with the DQ kept FP32 behind a Cast (0.035% of range
against 0.041% on the probe's 8 inputs; the Cast version is not fused)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from amp_compiler import convert
from amp_compiler.onnx.measure.output_error import output_accuracy
from amp_compiler.runtime.runner import InProcessRunner
from tests.support.weight_only import weight_only_model


def _optimized_ops(model: onnx.ModelProto, tmp_path) -> list[str]:
    """The op types of ``model`` after onnxruntime's CPU optimizations at ORT_ENABLE_ALL, with its DQ -> MatMul
    fusion into MatMulNBits on (``session.enable_dq_matmulnbits_fusion``, off by default in 1.32)."""
    ort = pytest.importorskip("onnxruntime")
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.add_session_config_entry("session.enable_dq_matmulnbits_fusion", "1")
    opts.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return [n.op_type for n in onnx.load(tmp_path / "optimized.onnx").graph.node]


def test_the_converted_weight_only_matmul_fuses_into_matmulnbits(tmp_path):
    fp32 = weight_only_model(21)
    assert "MatMulNBits" in _optimized_ops(fp32, tmp_path)  # the FP32 model fuses: the pattern is onnxruntime's
    converted = convert(fp32, probe=False).model
    ops = _optimized_ops(converted, tmp_path)
    assert "MatMulNBits" in ops and "DequantizeLinear" not in ops, ops


def test_the_converted_weight_only_model_is_as_accurate_as_fp32_under_emulation():
    fp32 = weight_only_model(21)
    rng = np.random.default_rng(3)
    samples = [{"x": (rng.standard_normal((1, 16, 128)) * s).astype(np.float32)} for s in (0.1, 1.0, 4.0, 10.0)]
    result = convert(fp32, probe=False)
    (acc,) = output_accuracy(fp32, result.model, samples, InProcessRunner())
    assert acc.finite and acc.cosine > 0.99999 and acc.max_abs_error < 1e-3 * acc.value_range, acc
