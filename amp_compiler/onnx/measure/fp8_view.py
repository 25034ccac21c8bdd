"""The converted model's FP8 Q/DQ arithmetic as nodes of a probe model: one GEMM data input as the
FP8 model computes it, and as the fallback (FP16/BF16) model holds it.

Guarantees: :func:`fp8_view` computes, in FP32, exactly what the converted model's Q/DQ nodes
(:mod:`amp_compiler.passes.onnx.qdq`) give the GEMM: an activation in the fallback type (the
scale's: FP16 or BF16), ``x / scale`` in float32, saturated, the DequantizeLinear output rounded to
the fallback type; a weight quantized from its FP32 values by QuantizeLinear with the FP32 values of
its scales (as :func:`amp_compiler.core.fp8_numbers.quantize` quantizes it offline), then dequantized
the same way. A probe holds each weight once: the view reads the FP32 weight, it copies nothing.
Both probes use it: the local statistics (:mod:`amp_compiler.onnx.fp8.stats`) and the switched probe
(:mod:`amp_compiler.onnx.measure.probe`).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper

from amp_compiler.passes.onnx.qdq import Fp8Input

__all__ = ["Fp8View", "fp8_view"]


@dataclasses.dataclass
class Fp8View:
    """Nodes and initializers (for a probe model) that compute one data input as the FP8 model sees it
    (``fp8``: quantized, dequantized to FP16, widened) and as the FP16 model sees it (``fp16``), in FP32."""

    nodes: list[onnx.NodeProto]
    initializers: list[onnx.TensorProto]
    fp8: str
    fp16: str
    scale: str = ""  # the activation's FP32 scale initializer ("" for a weight)


def fp8_view(inp: Fp8Input, prefix: str, source: str | None = None) -> Fp8View:
    """The :class:`Fp8View` of ``inp`` read from the tensor ``source`` (default: ``inp.name``; for a
    weight, a tensor holding its FP32 values); its names start with ``prefix`` (see module doc)."""
    source = inp.name if source is None else source
    f32, f16 = onnx.TensorProto.FLOAT, inp.low_type
    if inp.weight is not None:
        return _weight_view(inp, prefix, source)
    a, s = prefix + "a", prefix + "s"
    zp = onnx.helper.make_tensor(prefix + "zp", onnx.TensorProto.FLOAT8E4M3FN, [], [0.0])
    nodes = [
        oh.make_node("Cast", [source], [a + "h"], to=f16),
        oh.make_node("Cast", [a + "h"], [a + "r"], to=f32),  # the FP16 value the model holds
        oh.make_node("QuantizeLinear", [a + "r", s, zp.name], [a + "q"], saturate=1),
        oh.make_node("DequantizeLinear", [a + "q", s, zp.name], [a + "dq"]),
        oh.make_node("Cast", [a + "dq"], [a + "dqh"], to=f16),  # DQ's output is FP16/BF16 in the model
        oh.make_node("Cast", [a + "dqh"], [a + "8"], to=f32),
    ]
    return Fp8View(nodes, [onnx.numpy_helper.from_array(inp.scale.astype(np.float32), s), zp], a + "8", a + "r", s)


def _weight_view(inp: Fp8Input, prefix: str, source: str) -> Fp8View:
    """A weight's :class:`Fp8View`, computed in the probe from its FP32 values ``source``: QuantizeLinear
    with the FP32 values of its scales, DequantizeLinear rounded to the fallback type; and the weight
    rounded to the fallback type."""
    f32, low = onnx.TensorProto.FLOAT, inp.low_type
    w, s, zp = prefix + "w", prefix + "s", prefix + "zp"
    scale = inp.scale.astype(np.float32)
    zero = onnx.helper.make_tensor(zp, onnx.TensorProto.FLOAT8E4M3FN, list(scale.shape), [0.0] * scale.size)
    quant = oh.make_node("QuantizeLinear", [source, s, zp], [w + "q"], saturate=1)
    dequant = oh.make_node("DequantizeLinear", [w + "q", s, zp], [w + "dq"])
    if inp.axis is not None:
        for node in (quant, dequant):
            node.attribute.append(oh.make_attribute("axis", inp.axis))
    nodes = [
        quant,
        dequant,
        oh.make_node("Cast", [w + "dq"], [w + "dqh"], to=low),  # DQ's output is FP16/BF16 in the model
        oh.make_node("Cast", [w + "dqh"], [w + "8"], to=f32),
        oh.make_node("Cast", [source], [w + "h"], to=low),
        oh.make_node("Cast", [w + "h"], [w + "16"], to=f32),
    ]
    return Fp8View(nodes, [onnx.numpy_helper.from_array(scale, s), zero], w + "8", w + "16")
