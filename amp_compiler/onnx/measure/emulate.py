"""Emulate low-precision storage on a CPU, exactly.

onnxruntime's CPU provider has almost no BF16 kernels, and for FP16 it runs most ops (MatMul, Conv on
x86) in FP32 between Casts that its optimizer then partly removes, so an FP16 tensor that overflows
or underflows on a GPU may never be rounded on a CPU. :func:`emulate` rewrites a model whose tensors
are FP16 or BF16 into an FP32 model that rounds every such tensor to its type (a ``Cast(low) ->
Cast(float)`` round trip after each producer). Each op then computes in FP32 on rounded inputs and
its output is rounded: what a GPU does with low-precision storage and FP32 accumulation, overflow to
inf and flush to zero included. Low-precision constants widen to FP32 exactly, so the numbers seen
are the ones the converted model holds. Tests check accuracy this way on CPU-only machines.

Graph inputs and outputs that were FP16/BF16 become FP32 (feed FP32 arrays; they are rounded on
entry). Tensor types come from onnx's shape inference, and for the ops it does not define
(onnxruntime's contrib ops) from their schemas (:mod:`amp_compiler.onnx.ir.schema_typing`), so their
low-precision outputs are rounded too; their kernels run in FP32 on rounded inputs. A tensor whose
type neither gives is not rounded (none is, in the catalog's models).

``tf32=True`` also rounds the FP32 operands of every Tensor Core op (the ``gemm`` layouts' operands in
the policy table: MatMul's A and B, a convolution's data and weight) to TF32, 10 explicit mantissa
bits, as GPUs from Ampere on read them where FP32 GEMMs run on Tensor Cores: onnxruntime's CUDA
provider does by default (``use_tf32``), as does TensorRT (``BuilderFlag.TF32``). That is what an FP32
node of the written model computes there unless the user turns TF32 off; the product itself stays
exact FP32 (TF32 accumulates in FP32). Rounding is to nearest, ties to even (Veltkamp's split in FP32
arithmetic: ``t = x * (2^13 + 1)``, ``x' = t - (t - x)``, exact); kernels that convert with
``cvt.rna`` differ at ties only, kernels that read the operand's top bits (truncation) err up to
twice as far, toward zero. Magnitudes from 2^114 on (where the split would overflow), inf and NaN
pass unrounded.

FP8 (E4M3) Q/DQ graphs run as they are: onnxruntime's CPU QuantizeLinear/DequantizeLinear with
float8e4m3fn is exact, and :mod:`amp_compiler.core.fp8_numbers` computes the same values in numpy
(bit for bit: ``tests/onnx/fp8/test_fp8.py``). Run such graphs at onnxruntime's BASIC optimization
level: from EXTENDED on, its ReluQuantTransformer deletes a Relu that feeds a float8
QuantizeLinear (emulated graphs are safe: a rounding Cast sits between the two).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.shape_inference
import onnx_ir as ir

from amp_compiler.onnx.ir.schema_typing import type_from_schemas
from amp_compiler.onnx.ir.walk import iter_graphs
from amp_compiler.onnx.load.proto_walk import iter_proto_graphs
from amp_compiler.policy import default_table

__all__ = [
    "emulate", "emulate_bf16", "emulate_in_place", "rounded_origin", "stored_values", "stores_low_precision",
    "typed_model",
]

# The rounded copy of a tensor ``X`` is named ``X__f32emu<n>`` (see rounded_origin).
ROUNDED_TAG = "__f32emu"
_F32 = ir.DataType.FLOAT
_LOW = (ir.DataType.FLOAT16, ir.DataType.BFLOAT16)
_LOW_INTS = frozenset(int(t) for t in _LOW)


def _widen_tensor(t: ir.TensorProtocol, name: str | None) -> ir.TensorProtocol:
    return ir.tensor(t.numpy().astype(np.float32), name=name)


def _round_trip(
    graph: ir.Graph, value: ir.Value, low_type: ir.DataType, after: ir.Node | None, tag: int
) -> ir.Value | None:
    """Make ``value``'s users read it rounded to ``low_type``; the rounded copy (None: nothing reads it)."""
    users = list(value.uses())
    outputs = [i for i, v in enumerate(graph.outputs) if v is value]
    if not users and not outputs:
        return None
    low = ir.Value(name=f"{value.name}__lowemu{tag}", type=ir.TensorType(low_type), shape=value.shape)
    back = ir.Value(name=f"{value.name}{ROUNDED_TAG}{tag}", type=ir.TensorType(_F32), shape=value.shape)
    to_low = ir.Node("", "Cast", [value], [ir.AttrInt64("to", int(low_type))], outputs=[low])
    to_f32 = ir.Node("", "Cast", [low], [ir.AttrInt64("to", int(_F32))], outputs=[back])
    if after is not None:
        graph.insert_after(after, [to_low, to_f32])
    elif len(graph) > 0:
        graph.insert_before(next(iter(graph)), [to_low, to_f32])
    else:
        graph.extend([to_low, to_f32])
    for user, index in users:
        user.replace_input_with(index, back)
    for i in outputs:
        # Keep the output name: the rounded value takes it.
        name = value.name
        value.name = f"{name}__unrounded{tag}"
        back.name = name
        graph.outputs[i] = back
    return back


def rounded_origin(name: str) -> str | None:
    """For the rounded copy of a tensor that :func:`emulate` made, the original tensor's name (what
    its users read in the emulated model, as the low-precision model stores it); else None."""
    stem, tag, number = name.rpartition(ROUNDED_TAG)
    return stem if tag and number.isdigit() else None


def stored_values(values: dict) -> dict:
    """Tensors of a run of an emulated model (by name) with each rounded copy standing for its original:
    the values the low-precision model stores, by the names of the model before emulation."""
    out = dict(values)
    for name, value in values.items():
        origin = rounded_origin(name)
        if origin is not None:
            out[origin] = value
    return out


def emulate(model: onnx.ModelProto, *, tf32: bool = False) -> onnx.ModelProto:
    """An FP32 model that computes what ``model`` computes with FP16/BF16 storage (see module doc); with
    ``tf32``, its FP32 Tensor Core ops' operands rounded to TF32, as a GPU runs them by default."""
    m = typed_model(model)
    emulate_in_place(m, tf32=tf32)
    out = ir.to_proto(m)
    out.ir_version = model.ir_version
    return out


def typed_model(model: onnx.ModelProto) -> ir.Model:
    """``model`` in the IR with every tensor's element type that shape inference or the ops' schemas
    give (contrib ops' outputs, and what follows them, included): what :func:`emulate_in_place` reads."""
    m = ir.from_proto(onnx.shape_inference.infer_shapes(model))
    type_from_schemas(m)
    return m


def emulate_in_place(m: ir.Model, *, tf32: bool = False) -> dict[ir.Value, ir.Value]:
    """Rewrite a typed model (:func:`typed_model`) as :func:`emulate` does; returns each rounded copy
    with the value it rounds (``tf32``'s roundings are not listed: they are what an op reads, not what
    the model stores). Nodes stay the same objects (rounding Casts are added after them), so a
    caller can find them again."""
    rounded: dict[ir.Value, ir.Value] = {}
    tag = 0
    for graph in list(iter_graphs(m.graph)):
        for init in list(graph.initializers.values()):
            if init.dtype in _LOW and init.const_value is not None:
                init.const_value = _widen_tensor(init.const_value, init.name)
                init.type = ir.TensorType(_F32)
        for value in list(graph.inputs):
            if value.dtype in _LOW:
                low_type = value.dtype
                value.type = ir.TensorType(_F32)
                tag += 1
                _keep(rounded, _round_trip(graph, value, low_type, None, tag), value)
        for node in list(graph):
            for name, attr in list(node.attributes.items()):
                if attr.type == ir.AttributeType.TENSOR and attr.value.dtype in _LOW:
                    node.attributes[name] = ir.AttrTensor(name, _widen_tensor(attr.value, attr.value.name))
                elif name in ("to", "dtype") and attr.type == ir.AttributeType.INT and attr.value in _LOW_INTS:
                    node.attributes[name] = ir.AttrInt64(name, int(_F32))
            for out in node.outputs:
                if out.dtype in _LOW:
                    low_type = out.dtype
                    out.type = ir.TensorType(_F32)
                    if node.op_type != "Constant":
                        tag += 1
                        _keep(rounded, _round_trip(graph, out, low_type, node, tag), out)
        for value in graph.outputs:
            if value.dtype in _LOW:
                value.type = ir.TensorType(_F32)
        if tf32:
            _read_as_tf32(graph)
    return rounded


#: Veltkamp's splitting constant for TF32: 2^(24 - 11) + 1 (FP32's 24 significant bits, TF32's 11).
_TF32_SPLIT = 8193.0
#: Magnitudes from here on pass unrounded: ``x * 8193`` would overflow FP32 (its largest is 2^128 - 2^104).
_TF32_LARGEST = 2.0**114


def _read_as_tf32(graph: ir.Graph) -> None:
    """Make this graph's Tensor Core ops read their FP32 operands rounded to TF32 (module doc): one
    rounded copy per value, made before its first such reader."""
    table = default_table()
    copies: dict[ir.Value, ir.Value] = {}
    constants: list[ir.Value] = []  # the split's two scalars, made once per graph at its first use
    for node in list(graph):
        tensor_core = table.is_tensor_core(node.domain, node.op_type)
        layout = table.gemm_layout(node.domain, node.op_type) if tensor_core else None
        if layout is None:
            continue
        for index in layout.operands:
            if not isinstance(index, int) or index >= len(node.inputs):
                continue
            value = node.inputs[index]
            if value is None or value.dtype != _F32:
                continue
            if value not in copies:
                copies[value] = _tf32_copy(graph, value, node, constants)
            node.replace_input_with(index, copies[value])


def _tf32_copy(graph: ir.Graph, value: ir.Value, before: ir.Node, constants: list[ir.Value]) -> ir.Value:
    """``value`` rounded to TF32 by nodes inserted before ``before``: ``Where(|x| < 2^114, t - (t - x), x)``
    with ``t = x * 8193``; ``constants``: the graph's 8193 and 2^114, made here where it has none yet
    (before the first reader, so before every later one)."""
    name = value.name or "tf32"

    def made(op: str, inputs: list[ir.Value], suffix: str, **attributes: float) -> ir.Value:
        attrs = [ir.AttrFloat32(k, v) for k, v in attributes.items()]
        node = ir.Node("", op, inputs, attrs, outputs=[ir.Value(name=f"{name}__tf32{suffix}")])
        graph.insert_before(before, node)
        return node.outputs[0]

    if not constants:
        constants += [made("Constant", [], "_split", value_float=_TF32_SPLIT),
                      made("Constant", [], "_largest", value_float=_TF32_LARGEST)]
    split, largest = constants
    t = made("Mul", [value, split], "_t")
    hi = made("Sub", [t, made("Sub", [t, value], "_d")], "_hi")
    small = made("Less", [made("Abs", [value], "_abs"), largest], "_small")
    out = made("Where", [small, hi, value], "")
    out.type, out.shape = ir.TensorType(_F32), value.shape
    return out


def _keep(rounded: dict[ir.Value, ir.Value], copy: ir.Value | None, original: ir.Value) -> None:
    if copy is not None:
        rounded[copy] = original


def stores_low_precision(model: onnx.ModelProto) -> bool:
    """Whether ``model`` holds FP16 or BF16 values anywhere (an input, a weight, a Cast to them, a Constant):
    an input already partly low, which onnxruntime's CPU provider runs otherwise than a GPU would, so its
    own outputs there are no exact reference (:func:`emulate` of it is)."""
    for graph in iter_proto_graphs(model.graph):
        if any(t.data_type in _LOW_INTS for t in graph.initializer):
            return True
        if any(v.type.tensor_type.elem_type in _LOW_INTS for v in graph.input):
            return True
        for node in graph.node:
            for attr in node.attribute:
                if (node.op_type == "Cast" and attr.name == "to" and attr.i in _LOW_INTS) or (
                        attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type in _LOW_INTS):
                    return True
    return False


def emulate_bf16(model: onnx.ModelProto) -> onnx.ModelProto:
    """:func:`emulate` for BF16 models (kept for its name: it is the same rewrite)."""
    return emulate(model)
