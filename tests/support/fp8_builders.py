"""Small FP8 test models and helpers shared by the FP8 tests: an MLP (optionally with an input
outlier), a Conv net, onnxruntime at its BASIC level, and a conversion to FP8 in this process."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as nh
import onnxruntime as ort

from amp_compiler import convert
from amp_compiler.runtime.runner import InProcessRunner

F32 = onnx.TensorProto.FLOAT


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    """onnxruntime at BASIC: from EXTENDED on it deletes a Relu that feeds a float8 QuantizeLinear."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    opts.log_severity_level = 4
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def mlp(outlier: bool = False) -> tuple[onnx.ModelProto, list[dict[str, np.ndarray]]]:
    """x -> MatMul -> Relu -> Gemm(transB) -> Conv-free MLP; with ``outlier``, the first MatMul's input has
    one huge value per sample (which its weights ignore), so its scale leaves the other values below FP8's
    smallest normal."""
    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((16, 32)) * 0.2).astype(np.float32)
    w2 = (rng.standard_normal((8, 32)) * 0.2).astype(np.float32)
    if outlier:
        w1[0] = 0.0  # the outlier does not reach the Gemm
    graph = oh.make_graph(
        [oh.make_node("MatMul", ["x", "W1"], ["h"], name="mm1"),
         oh.make_node("Relu", ["h"], ["r"], name="relu"),
         oh.make_node("Gemm", ["r", "W2", "b2"], ["y"], name="gemm2", transB=1)],
        "mlp", [oh.make_tensor_value_info("x", F32, [4, 16])], [oh.make_tensor_value_info("y", F32, [4, 8])],
        [nh.from_array(w1, "W1"), nh.from_array(w2, "W2"), nh.from_array(np.ones(8, np.float32), "b2")],
    )
    samples = []
    for _ in range(4):
        x = rng.standard_normal((4, 16)).astype(np.float32)
        if outlier:
            x[0, 0] = 2.0e4
        samples.append({"x": x})
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)]), samples


def conv_net() -> tuple[onnx.ModelProto, list[dict[str, np.ndarray]]]:
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((16, 8, 3, 3)) * 0.1).astype(np.float32)
    graph = oh.make_graph(
        [oh.make_node("Conv", ["x", "W", "B"], ["c"], name="conv", pads=[1, 1, 1, 1]),
         oh.make_node("ReduceMean", ["c"], ["y"], name="mean", axes=[2, 3], keepdims=0)],
        "conv", [oh.make_tensor_value_info("x", F32, [2, 8, 8, 8])], [oh.make_tensor_value_info("y", F32, [2, 16])],
        [nh.from_array(w, "W"), nh.from_array(np.zeros(16, np.float32), "B")],
    )
    samples = [{"x": rng.standard_normal((2, 8, 8, 8)).astype(np.float32)} for _ in range(3)]
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 13)]), samples


def to_fp8(model, samples, **options):
    with InProcessRunner() as runner:
        return convert(model, target="fp8", samples=samples, runner=runner, **options)
