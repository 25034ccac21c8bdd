"""A weight-only quantized model: ``DequantizeLinear`` of a constant integer weight -> MatMul (4-bit blocks from
opset 21, as onnxruntime's int4 quantizer and ModelOpt INT4-AWQ write it; int8 per channel before)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from tests.support.onnx_builders import F32, tensor, vi
from tests.support.onnx_builders import model as make_model

__all__ = ["BLOCK", "K", "N", "weight_only_model"]

K, N, BLOCK = 128, 64, 32


def _uint4(name: str, values: np.ndarray) -> onnx.TensorProto:
    """A UINT4 initializer of ``values`` (0..15), packed two to a byte, low nibble first."""
    flat = values.astype(np.uint8).reshape(-1)
    packed = flat[0::2] | (flat[1::2] << 4)
    return helper.make_tensor(name, onnx.TensorProto.UINT4, list(values.shape), packed.tobytes(), raw=True)


def weight_only_model(opset: int = 21, scale: float = 1.0, activation_dq: bool = False) -> onnx.ModelProto:
    """x -> MatMul(x, DQ(w)) -> Relu -> MatMul(., w2): from opset 21 the weight is 4-bit, blocks of 32 along K
    (onnxruntime's int4 quantizer, ModelOpt INT4-AWQ), before it int8 per output channel. ``scale`` multiplies
    the weight's scales (about 0.01-0.03); ``activation_dq``: x goes through QuantizeLinear -> DequantizeLinear."""
    rng = np.random.default_rng(0)
    if opset >= 21:
        inits = [_uint4("wq", rng.integers(0, 16, (K, N))), _uint4("wz", np.full((K // BLOCK, N), 8)),
                 tensor("ws", ((rng.random((K // BLOCK, N)) * 0.02 + 0.01) * scale).astype(np.float32))]
        dq = helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], name="dqw", axis=0, block_size=BLOCK)
    else:
        inits = [tensor("wq", rng.integers(-127, 128, (K, N)).astype(np.int8)), tensor("wz", np.zeros(N, np.int8)),
                 tensor("ws", ((rng.random(N) * 0.002 + 0.001) * scale).astype(np.float32))]
        dq = helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], name="dqw", axis=1)
    inits.append(tensor("w2", (rng.standard_normal((N, 8)) * 0.1).astype(np.float32)))
    nodes = [dq, helper.make_node("MatMul", ["xd" if activation_dq else "x", "w"], ["h"], name="qprod"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="plain")]
    if activation_dq:
        inits += [tensor("xs", np.array(0.02, np.float32)), tensor("xz", np.array(0, np.int8))]
        nodes[:0] = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"], name="qx"),
                     helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"], name="dqx")]
    m = make_model(nodes, [vi("x", F32, [1, 16, K])], [vi("y", F32, [1, 16, 8])], inits, opset=opset,
                   ir_version=10 if opset >= 21 else 9)
    onnx.checker.check_model(m, full_check=True)
    return m
