"""``emulate(..., tf32=True)``: FP32 Tensor Core operands read as TF32, as GPUs run FP32 GEMMs by default."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from amp_compiler.onnx.measure.emulate import emulate


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _tf32(x: np.ndarray) -> np.ndarray:
    """``x`` rounded to 10 explicit mantissa bits, to nearest, ties to even, on its bits."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0xFFF + ((bits >> 13) & 1)) & ~np.uint64(0x1FFF)
    return bits.astype(np.uint32).view(np.float32)


def _matmul(k: int, n: int, weight: np.ndarray | None = None, dtype: int = onnx.TensorProto.FLOAT) -> onnx.ModelProto:
    inputs = [helper.make_tensor_value_info("x", dtype, ["m", k])]
    inits = []
    if weight is None:
        inputs.append(helper.make_tensor_value_info("w", dtype, [k, n]))
    else:
        inits.append(numpy_helper.from_array(weight, "w"))
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Add", ["y", "y"], ["z"])],
                              "g", inputs, [helper.make_tensor_value_info("z", dtype, ["m", n])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_operands_are_read_rounded_to_nearest_even_at_ten_mantissa_bits():
    """Each operand is rounded exactly as TF32 holds it (ties to even included); the product and what
    follows it (Add) stay exact FP32 arithmetic on those operands."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((64, 32)) * 10.0 ** rng.integers(-20, 20, (64, 32))).astype(np.float32)
    tie = (x.view(np.uint32) & ~np.uint32(0x1FFF)) | np.uint32(0x1000)  # exactly halfway between two TF32 values
    x[::3] = tie.view(np.float32)[::3]
    w = np.eye(32, 8, dtype=np.float32) * np.float32(1 + 2.0**-15)  # 1 + 2^-15: TF32 reads 1
    emulated = emulate(_matmul(32, 8, w), tf32=True)
    onnx.checker.check_model(emulated, full_check=True)
    (z,) = _run(emulated, {"x": x})
    expected = _tf32(x)[:, :8] * 2
    np.testing.assert_array_equal(z, expected)
    (exact,) = _run(emulate(_matmul(32, 8, w)), {"x": x})
    assert not np.array_equal(exact, expected)  # without tf32 the weight's last bits count


def test_inf_nan_and_huge_values_pass_unrounded():
    """inf, NaN and magnitudes from 2^114 on (where the split would overflow) reach the product as they are."""
    x = np.array([[np.inf, 2.0**120 * (1 + 2.0**-20), -(2.0**115) * (1 + 2.0**-20), 1 + 2.0**-20]], np.float32)
    eye = np.eye(4, dtype=np.float32)
    for i in range(4):
        row = np.zeros((1, 4), np.float32)
        row[0, i] = x[0, i]
        (z,) = _run(emulate(_matmul(4, 4, eye), tf32=True), {"x": row})
        assert z[0, i] == (row[0, i] * 2 if i < 3 else 2.0)  # the last is rounded: 1 + 2^-20 reads as 1
    (z,) = _run(emulate(_matmul(4, 4, eye), tf32=True), {"x": np.full((1, 4), np.nan, np.float32)})
    assert np.isnan(z).all()


def test_activations_operands_and_convolutions_too_but_not_a_bias():
    """Both operands given at run time are rounded, and a convolution's data and weight; its bias is
    added in FP32 (the kernels' epilogue), so it is not."""
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal((4, 6)).astype(np.float32), rng.standard_normal((6, 3)).astype(np.float32)
    (z,) = _run(emulate(_matmul(6, 3), tf32=True), {"x": x, "w": w})
    np.testing.assert_allclose(z, 2 * (_tf32(x).astype(np.float64) @ _tf32(w)), rtol=1e-6)

    bias = np.array([1 + 2.0**-20], np.float32)
    weight = np.full((1, 1, 1, 1), 1 + 2.0**-20, np.float32)
    conv = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["y"])], "c",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 1, 1, 2])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 1, 1, 2])],
        [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b")])
    model = helper.make_model(conv, opset_imports=[helper.make_opsetid("", 17)])
    data = np.array([[[[1 + 2.0**-20, 3.0]]]], np.float32)
    (y,) = _run(emulate(model, tf32=True), {"x": data})
    np.testing.assert_array_equal(y, np.array([[[[1.0, 3.0]]]], np.float32) + bias)


@pytest.mark.parametrize("dtype", [onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16])
def test_low_precision_operands_are_already_tf32(dtype):
    """FP16 and BF16 values have at most 10 mantissa bits: an FP16/BF16 model emulates the same with tf32."""
    rng = np.random.default_rng(9)
    model = _matmul(16, 4, dtype=dtype)
    feeds = {"x": rng.standard_normal((8, 16)).astype(np.float32), "w": rng.standard_normal((16, 4)).astype(np.float32)}
    np.testing.assert_array_equal(_run(emulate(model, tf32=True), feeds)[0], _run(emulate(model), feeds)[0])


def test_an_operand_read_by_two_products_is_rounded_once():
    """One rounded copy per value: a second reader takes the first one's."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "x"], ["a"]), helper.make_node("MatMul", ["a", "x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3, 3])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3, 3])])
    emulated = emulate(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tf32=True)
    assert sum(n.op_type == "Where" for n in emulated.graph.node) == 2  # x once, a once
    x = np.random.default_rng(1).standard_normal((3, 3)).astype(np.float32)
    (y,) = _run(emulated, {"x": x})
    t = _tf32(x).astype(np.float64)
    a = (t @ t).astype(np.float32)
    np.testing.assert_allclose(y, _tf32(a).astype(np.float64) @ t, rtol=1e-6)
