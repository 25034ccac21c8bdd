"""The values of constants in the IR: an initializer's or a Constant node's array, and FP32 bytes as
the model file stores them (what passes over many small constants read without an array each)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
from onnx_ir.serde import TensorProtoTensor

__all__ = ["SCREEN_BYTES", "constant_array", "raw_float32_bytes"]


#: Bytes of FP32 constants screened together (one numpy call per group: per tensor, numpy's own
#: overhead dominates for small ones; one group for all would copy every weight at once).
SCREEN_BYTES = 64 * 2**20


def raw_float32_bytes(tensor: object) -> bytes | None:
    """The little-endian bytes of an FP32 tensor as the model file stores them (``raw_data``), or
    None for any other tensor (another type, typed fields, external data, not from a file): what
    vectorized passes over many small constants read without building an array per tensor."""
    if type(tensor) is not TensorProtoTensor:
        return None
    proto = tensor.raw
    if proto.data_type != onnx.TensorProto.FLOAT or proto.data_location or not proto.HasField("raw_data"):
        return None
    return proto.raw_data


def constant_array(value: ir.Value) -> np.ndarray | None:
    """The value of an initializer or Constant node output, or None if it has none we can read."""
    if value.const_value is not None:
        return value.const_value.numpy()
    producer = value.producer()
    if producer is None or producer.op_type != "Constant":
        return None
    for name, attr in producer.attributes.items():
        if name == "value":
            return attr.value.numpy()
        if name == "value_float":
            return np.array(attr.value, dtype=np.float32)
        if name == "value_floats":
            return np.array(attr.value, dtype=np.float32)
    return None
