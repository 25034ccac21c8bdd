"""What a float input's first product's weights say of its scale (sweeps Q and S: a tabular model trained on raw
units, an income near 1e5, converted with no warning while its FP16 input Cast is infinite)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from amp_compiler import InProcessRunner, convert
from amp_compiler.onnx.graph.input_scale import weight_scale_warnings

FP16_MAX = 65504.0
#: Feature scales of a house-price model: square metres, a year, an income in dollars, rooms, and 12 standardized
#: ones (16 features: a first product of K < 16 over a raw input is policy.high.raw-small-product's FP32, where the
#: input is never cast to FP16).
RAW = np.array([150.0, 2000.0, 3e5, 5.0, *[1.0] * 12])


def _tabular(first: np.ndarray, gemm: bool = False) -> onnx.ModelProto:
    """``x [B, 16]`` -> first product (weights ``first``, [16, 16]) -> Relu -> MatMul -> ``y [B, 2]``."""
    rng = np.random.default_rng(0)
    product = (helper.make_node("Gemm", ["x", "w1t", "b1"], ["h"], name="fc1", transB=1) if gemm
               else helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"))
    inits = [numpy_helper.from_array(first.astype(np.float32), "w1"),
             numpy_helper.from_array(first.T.astype(np.float32).copy(), "w1t"),
             numpy_helper.from_array(np.zeros(16, np.float32), "b1"),
             numpy_helper.from_array(rng.standard_normal((16, 2)).astype(np.float32) / 4, "w2")]
    graph = helper.make_graph(
        [product, helper.make_node("Relu", ["h"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["y"])], "tab",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 2])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _trained_on_raw_units() -> np.ndarray:
    """First-layer weights of a model trained on raw features: each feature's of the order of its reciprocal."""
    rng = np.random.default_rng(1)
    return rng.standard_normal((16, 16)) * (3.0 / RAW)[:, None]


@pytest.mark.parametrize("gemm", [False, True])
def test_weights_of_a_raw_feature_say_it_overflows(gemm):
    model = ir.from_proto(_tabular(_trained_on_raw_units(), gemm))
    (warning,) = weight_scale_warnings(model, ["x"], FP16_MAX, lambda _: True)
    assert "fc1" in warning and "feature 2 of input 'x'" in warning  # the income, 3e5


def test_weights_of_normalized_features_or_a_dead_one_say_nothing():
    weights = np.random.default_rng(2).standard_normal((16, 16)) / 2
    assert weight_scale_warnings(ir.from_proto(_tabular(weights)), ["x"], FP16_MAX, lambda _: True) == []
    weights[1] = 0.0  # a feature the model ignores
    assert weight_scale_warnings(ir.from_proto(_tabular(weights)), ["x"], FP16_MAX, lambda _: True) == []


def test_a_product_kept_fp32_reads_the_input_as_it_is_and_says_nothing():
    model = ir.from_proto(_tabular(_trained_on_raw_units()))
    assert weight_scale_warnings(model, ["x"], FP16_MAX, lambda _: False) == []


def test_the_conversion_warns_unless_the_range_is_stated():
    model = _tabular(_trained_on_raw_units())
    warned = convert(model, runner=InProcessRunner()).warnings
    assert any("feature 2" in w for w in warned)
    stated = convert(model, input_ranges={"x": (0.0, 3e5)}, runner=InProcessRunner()).warnings
    assert not any("feature 2" in w for w in stated)


def test_samples_given_to_convert_calibrate_it_for_fp16():
    """``convert(model, samples=...)`` ignored the samples below FP8 (sweep S): the probe's N(0, 1) decided, and the
    FP16 model's income Cast was infinite on them. They are now its calibration data, and its error is measured on
    them."""
    model = _tabular(_trained_on_raw_units())
    rng = np.random.default_rng(3)
    samples = [{"x": (rng.uniform(0.5, 1.0, (8, 16)) * RAW).astype(np.float32)} for _ in range(3)]
    result = convert(model, samples=samples, runner=InProcessRunner())
    assert not result.probe_inputs  # no generated inputs
    (accuracy,) = result.accuracy
    assert accuracy.finite and accuracy.error_of_range < 0.01
    assert not any("feature 2" in w for w in result.warnings)  # the data showed the values
