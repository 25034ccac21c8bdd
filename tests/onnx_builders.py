"""Small helpers to build ONNX test graphs by hand."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from amp_compiler.policy import PolicyTable

F32 = TensorProto.FLOAT
F16 = TensorProto.FLOAT16


def tensor(name: str, array) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(array), name)


def vi(name: str, elem_type: int = F32, shape=None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem_type, shape)


def model(nodes, inputs, outputs, initializers=(), opset: int = 18, ir_version: int = 9, **kw) -> onnx.ModelProto:
    graph = helper.make_graph(list(nodes), kw.pop("name", "g"), list(inputs), list(outputs), list(initializers))
    imports = [helper.make_opsetid("", opset)] + kw.pop("extra_opsets", [])
    m = helper.make_model(graph, opset_imports=imports, **kw)
    m.ir_version = ir_version
    onnx.checker.check_model(m, full_check=True)
    return m


def weights(shape, seed: int = 0, scale: float = 0.3) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


TEST_POLICY = PolicyTable.from_toml(
    """
[[op]]
op = "MatMul"
category = "LOW"
reason = "Tensor Core GEMM"
[[op]]
op = "Conv"
category = "LOW"
reason = "Tensor Core convolution"
[[op]]
op = "Add"
category = "FOLLOW"
reason = "elementwise"
[[op]]
op = "Mul"
category = "FOLLOW"
reason = "elementwise"
[[op]]
op = "Tanh"
category = "FOLLOW"
reason = "bounded"
[[op]]
op = "Softmax"
category = "HIGH"
sensitivity = "arithmetic"
reason = "normalises exponentials"
[op.fp32_inside]
cuda = "test: accumulates in FP32"
[[op]]
op = "Exp"
category = "HIGH"
sensitivity = "range"
reason = "overflows above 11.09"
[[op]]
op = "Log"
category = "HIGH"
sensitivity = "range"
reason = "log of a flushed zero is -inf"
[[op]]
op = "Relu"
category = "PASS"
reason = "precision neutral"
[[op]]
op = "Reshape"
category = "PASS"
reason = "data movement"
[[op]]
op = "Gather"
category = "PASS"
reason = "data movement"
[[op]]
op = "Clip"
category = "PASS"
reason = "bounds"
[[op]]
op = "Where"
category = "PASS"
reason = "select"
[[op]]
op = "Identity"
category = "PASS"
reason = "data movement"
[[op]]
op = "If"
category = "PASS"
reason = "control flow"
[[op]]
op = "Loop"
category = "PASS"
reason = "control flow"
[[op]]
op = "Shape"
category = "NONFLOAT"
reason = "shapes are integers"
[[op]]
op = "Cast"
category = "PASS"
reason = "conversion"
dtype_attr = "to"
[[op]]
op = "BatchNormalization"
category = "FOLLOW"
reason = "affine per channel"
[[op]]
op = "LayerNormalization"
category = "HIGH"
sensitivity = "arithmetic"
reason = "mean and variance"
[op.fp32_inside]
cuda = "test: accumulates in FP32"
"""
)
