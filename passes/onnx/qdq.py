"""FP8 lowering: QuantizeLinear/DequantizeLinear to float8e4m3fn before the chosen GEMMs' data inputs.

Guarantees, for each chosen node whose data inputs have the fallback type (FP16, or BF16: the type
of the candidate's scales) after the FP16/BF16 lowering (a node that lowering kept in FP32 is left
alone and listed in ``skipped``):
- an activation input ``x`` is read through its own ``QuantizeLinear(x, scale, zero_point,
  saturate=1) -> DequantizeLinear(scale, zero_point)`` pair placed right before the GEMM (never
  shared with other readers of ``x``): a per-tensor scale of the fallback type and a float8e4m3fn
  zero point 0, as TensorRT's explicit quantization reads them;
- a constant weight becomes a float8e4m3fn initializer (quantized offline from its FP32 values,
  exactly as QuantizeLinear would, :func:`amp_compiler.core.fp8_numbers.quantize`) read through one
  ``DequantizeLinear`` with scales per output channel (``axis``) or per tensor; the FP16/BF16 copy
  is removed when nothing else reads it;
- bias inputs, and every other node, keep the types the FP16 lowering gave them.
The model's opset must already be 19 or later (the conversion raises it first).
"""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir

from amp_compiler.core.fp8_numbers import quantize
from amp_compiler.onnx.ir.walk import home_graph
from amp_compiler.targets import Target

__all__ = ["Fp8Candidate", "Fp8Input", "InsertedQdq", "QuantizeGemmInputsPass"]

_FP8 = ir.DataType.FLOAT8E4M3FN
_LOW_ONNX = {np.dtype(t.numpy_dtype): onnx.helper.np_dtype_to_tensor_dtype(np.dtype(t.numpy_dtype))
             for t in (Target.FP16, Target.BF16)}


@dataclasses.dataclass(frozen=True)
class Fp8Input:
    """One data input of a candidate: its position, tensor name, and scale (an array of the fallback
    type, FP16 or BF16: a scalar per tensor, or one per output channel along ``axis`` for a weight,
    whose FP32 values it keeps); ``amax`` is what the scale was taken from, ``calibration`` how."""

    index: int
    name: str
    scale: np.ndarray
    axis: int | None = None
    weight: np.ndarray | None = dataclasses.field(default=None, repr=False)
    amax: float = 0.0
    calibration: str = "amax"

    @property
    def low_type(self) -> int:
        """The ONNX element type of the scale (the fallback type the GEMM's inputs have)."""
        return _LOW_ONNX[self.scale.dtype]

    @property
    def low_name(self) -> str:
        """"FP16" or "BF16": the fallback type, for reasons."""
        return "BF16" if self.low_type == onnx.TensorProto.BFLOAT16 else "FP16"

    def broadcast_scale(self) -> np.ndarray:
        """The scale shaped to broadcast against the weight (per-axis) or as it is."""
        if self.axis is None or self.weight is None:
            return self.scale.astype(np.float32)
        shape = [1] * self.weight.ndim
        shape[self.axis] = -1
        return self.scale.astype(np.float32).reshape(shape)


@dataclasses.dataclass(frozen=True)
class Fp8Candidate:
    """A GEMM to read FP8 inputs, and the inputs it reads through Q/DQ."""

    node: ir.Node
    inputs: tuple[Fp8Input, ...]


@dataclasses.dataclass(frozen=True)
class InsertedQdq:
    """A Q or DQ node the pass inserted: the GEMM it feeds and which of its inputs."""

    gemm: ir.Node
    index: int
    weight: bool


def _zero_point(shape: tuple[int, ...]) -> np.ndarray:
    return np.zeros(shape, dtype=ml_dtypes.float8_e4m3fn)


class QuantizeGemmInputsPass(ir.passes.InPlacePass):
    """Q/DQ to FP8 E4M3 before the data inputs of ``chosen`` GEMMs (see module doc)."""

    def __init__(self, chosen: list[Fp8Candidate]):
        super().__init__()
        self.chosen = chosen
        self.inserted: dict[int, InsertedQdq] = {}  # id(Q/DQ node) -> what it is for
        self.quantized: list[ir.Node] = []  # GEMMs that now read FP8 inputs
        self.skipped: list[ir.Node] = []  # chosen GEMMs the FP16 policy kept in FP32

    def requires(self, model: ir.Model) -> None:
        opset = model.opset_imports.get("", 0)
        if opset < 19:
            raise ir.passes.PreconditionError(f"float8 Q/DQ needs opset 19 or later, the model has {opset}")

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        for k, cand in enumerate(self.chosen):
            node = cand.node
            low = ir.DataType(cand.inputs[0].low_type)
            values = [node.inputs[i.index] for i in cand.inputs]
            if any(v is None or v.dtype != low for v in values):
                self.skipped.append(node)
                continue
            graph = home_graph(node)
            for inp in cand.inputs:
                if inp.weight is not None:
                    self._weight(graph, node, inp, f"fp8_{k}_w{inp.index}")
                else:
                    self._activation(graph, node, inp, f"fp8_{k}_x{inp.index}")
            self.quantized.append(node)
        return ir.passes.PassResult(model, modified=bool(self.quantized))

    def ensures(self, model: ir.Model) -> None:
        for node in self.quantized:
            for cand in self.chosen:
                if cand.node is not node:
                    continue
                for inp in cand.inputs:
                    value = node.inputs[inp.index]
                    producer = value.producer() if value is not None else None
                    if producer is None or producer.op_type != "DequantizeLinear":
                        raise ir.passes.PostconditionError(f"{node.name}: input {inp.index} is not dequantized")

    def _initializer(self, graph: ir.Graph, name: str, array: np.ndarray) -> ir.Value:
        tensor = ir.tensor(array, name=name)
        value = ir.Value(name=name, const_value=tensor)
        value.type = ir.TensorType(tensor.dtype)
        value.shape = ir.Shape(array.shape)
        graph.register_initializer(value)
        return value

    def _dequantized(self, like: ir.Value, name: str, inp: Fp8Input) -> ir.Value:
        return ir.Value(name=name, type=ir.TensorType(ir.DataType(inp.low_type)),
                        shape=ir.Shape(like.shape) if like.shape else None)

    def _activation(self, graph: ir.Graph, node: ir.Node, inp: Fp8Input, prefix: str) -> None:
        source = node.inputs[inp.index]
        assert source is not None
        scale = self._initializer(graph, f"{prefix}_scale", inp.scale)
        zero = self._initializer(graph, f"{prefix}_zero_point", _zero_point(()))
        q_out = ir.Value(name=f"{prefix}_fp8", type=ir.TensorType(_FP8),
                         shape=ir.Shape(source.shape) if source.shape else None)
        dq_out = self._dequantized(source, f"{prefix}_dequantized", inp)
        q = ir.Node("", "QuantizeLinear", [source, scale, zero], [ir.AttrInt64("saturate", 1)], outputs=[q_out],
                    name=f"{prefix}_QuantizeLinear")
        dq = ir.Node("", "DequantizeLinear", [q_out, scale, zero], outputs=[dq_out], name=f"{prefix}_DequantizeLinear")
        graph.insert_before(node, [q, dq])
        node.replace_input_with(inp.index, dq_out)
        self.inserted[id(q)] = InsertedQdq(node, inp.index, False)
        self.inserted[id(dq)] = InsertedQdq(node, inp.index, False)

    def _weight(self, graph: ir.Graph, node: ir.Node, inp: Fp8Input, prefix: str) -> None:
        old = node.inputs[inp.index]
        assert old is not None and inp.weight is not None
        quantized = quantize(inp.weight, inp.broadcast_scale())
        stored = self._initializer(graph, f"{prefix}_fp8", quantized)
        scale = self._initializer(graph, f"{prefix}_scale", inp.scale)
        zero = self._initializer(graph, f"{prefix}_zero_point", _zero_point(inp.scale.shape))
        attrs = [ir.AttrInt64("axis", inp.axis)] if inp.axis is not None else []
        out = self._dequantized(stored, f"{prefix}_dequantized", inp)
        dq = ir.Node("", "DequantizeLinear", [stored, scale, zero], attrs, outputs=[out],
                     name=f"{prefix}_DequantizeLinear")
        graph.insert_before(node, [dq])
        node.replace_input_with(inp.index, out)
        self.inserted[id(dq)] = InsertedQdq(node, inp.index, True)
        _drop_if_unused(old)


def _drop_if_unused(value: ir.Value) -> None:
    """Remove ``value``'s initializer or Constant node when nothing reads it any more."""
    if value.uses() or value.is_graph_output() or value.is_graph_input():
        return
    producer = value.producer()
    if producer is not None:
        if producer.op_type == "Constant" and producer.graph is not None:
            producer.graph.remove(producer, safe=True)
        return
    graph = value.graph
    if value.is_initializer() and graph is not None and value.name and value.name in graph.initializers:
        del graph.initializers[value.name]
