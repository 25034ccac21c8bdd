"""The opset an FP8 model needs: 19 for float8 Q/DQ, 22 with a BF16 fallback (Conv takes bfloat16).

Guarantees: :func:`raise_opset` returns the model at that opset or later, rewritten by onnx's version
converter (which adapts the ops whose signature changed), with IR version 9 or later (float8 types),
or refuses with one line (an :class:`OptionError`). Ops of the default domain that onnx does not define
(onnxruntime's SimplifiedLayerNormalization, registered there at version 1, whose meaning no opset
change touches) are set aside while the converter runs, which would otherwise stop at them, and put
back unchanged. The input model is not modified.
"""

from __future__ import annotations

import onnx
import onnx.defs
import onnx.version_converter

from amp_compiler.errors import OptionError
from amp_compiler.onnx.load.proto_walk import model_graphs
from amp_compiler.targets import Target

__all__ = ["BF16_CONV_OPSET", "FP8_IR_VERSION", "FP8_OPSET", "fp8_opset", "raise_opset"]

FP8_OPSET = 19  # QuantizeLinear/DequantizeLinear take float8e4m3fn (and saturate) from opset 19
BF16_CONV_OPSET = 22  # Conv, ConvTranspose and a few more take bfloat16 from opset 22
FP8_IR_VERSION = 9  # float8 element types exist from IR version 9
_ASIDE = "amp_compiler.set_aside"  # the domain undefined default-domain ops wait in


def fp8_opset(fallback: Target) -> int:
    """The opset an FP8 model with ``fallback`` for the other ops is written at (at least)."""
    return BF16_CONV_OPSET if fallback is Target.BF16 else FP8_OPSET


def raise_opset(model: onnx.ModelProto, opset: int = FP8_OPSET) -> onnx.ModelProto:
    """``model`` at ``opset`` or later and IR version 9 or later (see module doc)."""
    current = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    out = model
    if current < opset:
        out = onnx.ModelProto()
        out.CopyFrom(model)
        aside = _set_aside(out)
        try:
            out = onnx.version_converter.convert_version(out, opset)
        except Exception as exc:  # the converter raises bare RuntimeErrors (C++ adapters)
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise OptionError(
                f"fp8 needs opset {opset} (float8 QuantizeLinear{', bfloat16 Conv' if opset > FP8_OPSET else ''}) "
                f"and onnx's version converter cannot raise this model's opset {current}: {first}",
                option="target",
            ) from None
        _put_back(out, aside)
        _keep_described(model, out)
    if out.ir_version < FP8_IR_VERSION:
        if out is model:
            out = onnx.ModelProto()
            out.CopyFrom(model)
        out.ir_version = FP8_IR_VERSION
    return out


def _set_aside(model: onnx.ModelProto) -> set[str]:
    """Move default-domain nodes onnx has no schema for into :data:`_ASIDE`; their op types."""
    aside = set()
    for graph in model_graphs(model):
        for node in graph.node:
            if node.domain in ("", "ai.onnx") and not onnx.defs.has(node.op_type, ""):
                node.domain = _ASIDE
                aside.add(node.op_type)
    if aside:
        model.opset_import.append(onnx.helper.make_opsetid(_ASIDE, 1))
    return aside


def _keep_described(original: onnx.ModelProto, converted: onnx.ModelProto) -> None:
    """Drop the value_info entries onnx's version converter added (its shape inference's, which the
    input did not describe): inside an If's branches they can contradict each other (an Optimum merged
    decoder's: a tensor of rank 1 in one branch, 3 in the other), and onnxruntime then refuses the
    written model. Each graph keeps the entries its counterpart in ``original`` had."""
    before = [{v.name for v in g.value_info} for g in model_graphs(original)]
    after = list(model_graphs(converted))
    if len(before) != len(after):
        every = set().union(*before)
        before = [every] * len(after)
    for graph, names in zip(after, before, strict=True):
        kept = [v for v in graph.value_info if v.name in names]
        if len(kept) != len(graph.value_info):
            del graph.value_info[:]
            graph.value_info.extend(kept)


def _put_back(model: onnx.ModelProto, aside: set[str]) -> None:
    if not aside:
        return
    for graph in model_graphs(model):
        for node in graph.node:
            if node.domain == _ASIDE:
                node.domain = ""
    kept = [o for o in model.opset_import if o.domain != _ASIDE]
    del model.opset_import[:]
    model.opset_import.extend(kept)
