"""Emulate a BF16 model on a CPU: onnxruntime's CPU provider has almost no BF16 kernels.

:func:`emulate_bf16` rewrites a model whose tensors are BF16 into an FP32 model that rounds every
former BF16 tensor to BF16 precision (a ``Cast(bf16) -> Cast(float)`` round trip after each producer).
Each op then computes in FP32 on BF16-rounded inputs and its output is rounded to BF16: what a GPU
does with BF16 storage and FP32 accumulation. BF16 constants widen to FP32 exactly, so the numbers
seen are the ones the BF16 model holds. This is how tests check BF16 accuracy on CPU-only machines.

Graph inputs and outputs that were BF16 become FP32 (feed FP32 arrays; they are rounded on entry).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir

from amp_compiler.graph import iter_graphs

_BF16 = ir.DataType.BFLOAT16
_F32 = ir.DataType.FLOAT


def _widen_tensor(t: ir.TensorProtocol, name: str | None) -> ir.Tensor:
    return ir.tensor(t.numpy().astype(np.float32), name=name)


def _round_trip(graph: ir.Graph, value: ir.Value, after: ir.Node | None, tag: int) -> None:
    """Make ``value``'s users read it rounded to BF16."""
    users = list(value.uses())
    outputs = [i for i, v in enumerate(graph.outputs) if v is value]
    if not users and not outputs:
        return
    low = ir.Value(name=f"{value.name}__bf16emu{tag}", type=ir.TensorType(_BF16), shape=value.shape)
    back = ir.Value(name=f"{value.name}__f32emu{tag}", type=ir.TensorType(_F32), shape=value.shape)
    to_low = ir.Node("", "Cast", [value], [ir.AttrInt64("to", int(_BF16))], outputs=[low])
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


def emulate_bf16(model: onnx.ModelProto) -> onnx.ModelProto:
    """An FP32 model that computes what ``model`` computes with BF16 tensors (see module doc)."""
    m = ir.from_proto(model)
    tag = 0
    for graph in list(iter_graphs(m.graph)):
        for init in list(graph.initializers.values()):
            if init.dtype == _BF16 and init.const_value is not None:
                init.const_value = _widen_tensor(init.const_value, init.name)
                init.type = ir.TensorType(_F32)
        for value in list(graph.inputs):
            if value.dtype == _BF16:
                value.type = ir.TensorType(_F32)
                tag += 1
                _round_trip(graph, value, None, tag)
        for node in list(graph):
            for name, attr in list(node.attributes.items()):
                if attr.type == ir.AttributeType.TENSOR and attr.value.dtype == _BF16:
                    node.attributes[name] = ir.AttrTensor(name, _widen_tensor(attr.value, attr.value.name))
                elif name in ("to", "dtype") and attr.type == ir.AttributeType.INT and attr.value == int(_BF16):
                    node.attributes[name] = ir.AttrInt64(name, int(_F32))
            for out in node.outputs:
                if out.dtype == _BF16:
                    out.type = ir.TensorType(_F32)
                    if node.op_type != "Constant":
                        tag += 1
                        _round_trip(graph, out, node, tag)
        for value in graph.outputs:
            if value.dtype == _BF16:
                value.type = ir.TensorType(_F32)
    out = ir.to_proto(m)
    out.ir_version = model.ir_version
    return out
