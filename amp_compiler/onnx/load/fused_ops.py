"""onnxruntime's CPU-fused ops whose CUDA kernels are FP32-only (or absent) split back into standard ops.

A model saved after onnxruntime's CPU graph optimizations (level 2, ``ORT_ENABLE_EXTENDED``: a session's
``optimized_model_filepath``, ``optimize_model(..., opt_level=2)``) holds two such fusions:

- ``com.microsoft::FusedConv``: its Conv + activation pairs, the Conv's attributes plus ``activation``
  (Relu, Tanh, Sigmoid, LeakyRelu, Clip, HardSigmoid) with its ``activation_params``, and an optional
  fourth input Z added before the activation. onnxruntime's CUDA FusedConv takes float only
  (``policy/ort_cuda_kernels.json``), so such a conv kept FP32 (rule ``provider.no-kernel``): a small conv
  net had 1 of its 4 Tensor Core ops in FP16, its unfused export 4 of 4, at the same accuracy.
- ``com.microsoft::FusedGemm``: its Gemm + activation pairs, the Gemm's ``alpha``, ``beta``, ``transA``,
  ``transB`` plus ``activation`` and the activation's own attributes renamed ``activation_<name>``
  (onnxruntime's ``GemmActivationFusion``: Elu, HardSigmoid, LeakyRelu, Relu, Selu, Sigmoid, Softplus,
  Softsign, Tanh, ThresholdedRelu; ScaledTanh, ParametricSoftplus of its experimental set). onnxruntime
  has no CUDA FusedGemm in any type, so such a Gemm kept FP32 (``provider.no-kernel``): a 4-layer MLP
  had 1 of its 4 Gemms in FP16, its unfused export 4 of 4.

CUDA's provider fuses Conv + activation again itself; the Gemm's activation is one elementwise op.

Guarantees: :func:`split_fused_ops` returns a model in which every well-formed FusedConv (2 to 4
inputs, one output, a known activation with the number of parameters onnxruntime's kernel reads)
of every graph is, in its place, ``Conv`` (its attributes but ``activation``/``activation_params``,
its name), then ``Add(., Z)`` where Z is given, then the activation op of the default domain: Relu,
Tanh, Sigmoid, ``LeakyRelu(alpha)``, ``HardSigmoid(alpha, beta)``, ``Clip`` with min/max as constant
inputs of the conv's element type (as attributes below opset 11); and every well-formed FusedGemm
(2 or 3 inputs, 3 from opset 11 down, one output, an activation of :data:`GEMM_ACTIVATION_PARAMS` with
every parameter onnxruntime's kernel reads) is ``Gemm`` (its ``alpha``, ``beta``, ``transA``,
``transB``, its name) then that activation op with those parameters under their own names — the same
function, exactly (the outputs differ by float rounding at most: onnxruntime's kernels apply the
activation in place after the product). Other fused ops are left to the model's checks (onnxruntime
refuses to run them), as are FusedGemm's ScaledTanh and ParametricSoftplus, which no standard op is.
The input model is not modified; it is returned itself where it has nothing to split.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterator
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from amp_compiler.onnx.load.opset import opset_of
from amp_compiler.onnx.load.proto_walk import model_graphs

__all__ = ["ACTIVATION_PARAMS", "GEMM_ACTIVATION_PARAMS", "FusedSplit", "split_fused_ops"]

#: The activations onnxruntime's FusedConv kernel applies, with how many ``activation_params`` each takes
#: (onnxruntime's ``GetFusedActivationAttr``: it refuses another count).
ACTIVATION_PARAMS: dict[str, int] = {"Relu": 0, "Tanh": 0, "Sigmoid": 0, "LeakyRelu": 1, "Clip": 2, "HardSigmoid": 2}
#: The activations onnxruntime's FusedGemm kernel applies that are one standard op, with the attributes
#: its kernel reads (as ``activation_<name>``; it refuses to run without one of them): onnxruntime's
#: ``ElementWiseRangedTransform::Create``, the same functors as the standalone ops.
GEMM_ACTIVATION_PARAMS: dict[str, tuple[str, ...]] = {
    "Relu": (), "Tanh": (), "Sigmoid": (), "Softplus": (), "Softsign": (), "LeakyRelu": ("alpha",),
    "Elu": ("alpha",), "ThresholdedRelu": ("alpha",), "HardSigmoid": ("alpha", "beta"), "Selu": ("alpha", "gamma"),
}
_DOMAIN = "com.microsoft"
_CLIP_INPUTS_OPSET = 11  # Clip takes min/max as inputs from opset 11 (attributes before)
_GEMM_OPTIONAL_C_OPSET = 11  # Gemm's C is optional from opset 11
_GEMM_ATTRS = ("alpha", "beta", "transA", "transB")
_PREFIX = "activation_"
_UNFUSED = {"FusedConv": "Conv", "FusedGemm": "Gemm"}


@dataclasses.dataclass(frozen=True)
class FusedSplit:
    """What :func:`split_fused_ops` did: ``model`` (the input itself where nothing was split) and, per
    fused op ("FusedConv", "FusedGemm") and activation ("Relu", "Relu+Z" where a Z was added, "none"),
    how many were split."""

    model: onnx.ModelProto
    split: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)

    @property
    def note(self) -> str:
        """What the conversion's summary says of it ("" where nothing was split)."""
        notes = []
        for op in sorted(self.split, key=lambda op: (op != "FusedConv", op)):
            kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(self.split[op].items()))
            cuda = "takes float only" if op == "FusedConv" else "has no kernel"
            notes.append(f"{sum(self.split[op].values())} com.microsoft {op} (onnxruntime's CPU fusion; CUDA's "
                         f"{cuda}) split into {_UNFUSED[op]} + activation, exactly: {kinds}")
        return ". ".join(notes)


def split_fused_ops(model: onnx.ModelProto, kept: Collection[str] = ()) -> FusedSplit:
    """``model`` with its FusedConvs and FusedGemms split (see the module doc), but those whose op type is in
    ``kept`` (the user's ``--block-op FusedConv``: the fused node, FP32 as blocked, not a Conv that no
    longer matches the block)."""
    opset = opset_of(model)

    def splits(node: onnx.NodeProto) -> bool:
        return node.op_type not in kept and _split_exactly(node, opset)

    if not any(splits(n) for g in model_graphs(model) for n in g.node):
        return FusedSplit(model)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    names = _Names(out)
    types = _element_types(out)
    split: dict[str, dict[str, int]] = {}
    for graph in model_graphs(out):
        if not any(splits(n) for n in graph.node):
            continue
        nodes: list[onnx.NodeProto] = []
        for node in graph.node:
            if not splits(node):
                nodes.append(node)
                continue
            constants: list[onnx.TensorProto] = []
            if node.op_type == "FusedGemm":
                parts, kind = _split_gemm(node, names), _activation(node)
            else:
                parts, constants, kind = _split(node, names, types, opset)
            nodes.extend(parts)
            graph.initializer.extend(constants)
            counts = split.setdefault(node.op_type, {})
            counts[kind] = counts.get(kind, 0) + 1
        del graph.node[:]
        graph.node.extend(nodes)
    return FusedSplit(out, split)


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _activation(node: onnx.NodeProto) -> str:
    value = next((a.s for a in node.attribute if a.name == "activation"), b"")
    return value.decode("utf-8", "replace")


def _split_exactly(node: onnx.NodeProto, opset: int) -> bool:
    """A fused op this module splits exactly: what onnxruntime's kernel runs."""
    if node.domain != _DOMAIN:
        return False
    if node.op_type == "FusedGemm":
        return _gemm_splittable(node, opset)
    if node.op_type != "FusedConv":
        return False
    if not 2 <= len(node.input) <= 4 or len(node.output) != 1 or not node.input[0] or not node.input[1]:
        return False
    activation = _activation(node)
    if not activation:
        return True  # a Conv (+ Z) alone
    params = next((list(a.floats) for a in node.attribute if a.name == "activation_params"), [])
    needs = ACTIVATION_PARAMS.get(activation)
    return needs is not None and needs in (0, len(params))  # onnxruntime reads none for Relu, Tanh, Sigmoid


def _gemm_splittable(node: onnx.NodeProto, opset: int) -> bool:
    """A FusedGemm onnxruntime runs whose activation is one standard op, as a Gemm the opset takes."""
    if not 2 <= len(node.input) <= 3 or len(node.output) != 1 or not node.input[0] or not node.input[1]:
        return False
    if (len(node.input) < 3 or not node.input[2]) and opset < _GEMM_OPTIONAL_C_OPSET:
        return False
    needs = GEMM_ACTIVATION_PARAMS.get(_activation(node))
    given = {a.name for a in node.attribute if a.type == onnx.AttributeProto.FLOAT}
    return needs is not None and all(_PREFIX + name in given for name in needs)


def _split_gemm(node: onnx.NodeProto, names: _Names) -> list[onnx.NodeProto]:
    """The Gemm and the activation op that replace ``node``."""
    attrs = _attrs(node)
    activation = _activation(node)
    label, out = node.name, node.output[0]
    gemm_out = names.new(f"{out}/gemm")
    gemm = helper.make_node("Gemm", list(node.input), [gemm_out], name=label,
                            **{k: attrs[k] for k in _GEMM_ATTRS if k in attrs})
    params: dict[str, Any] = {name: float(attrs[_PREFIX + name]) for name in GEMM_ACTIVATION_PARAMS[activation]}
    act = helper.make_node(activation, [gemm_out], [out], name=f"{label}/{activation}" if label else "", **params)
    return [gemm, act]


def _split(node: onnx.NodeProto, names: _Names, types: dict[str, int],
           opset: int) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto], str]:
    """The nodes that replace a FusedConv, the constants they read, and its kind for the note."""
    attrs = _attrs(node)
    activation = _activation(node)
    attrs.pop("activation", None)
    params = [float(p) for p in attrs.pop("activation_params", [])]
    x, w = node.input[0], node.input[1]
    bias = node.input[2] if len(node.input) > 2 else ""
    z = node.input[3] if len(node.input) > 3 else ""
    out = node.output[0]
    label = node.name
    steps = int(bool(z)) + int(bool(activation))
    conv_out = names.new(f"{out}/conv") if steps else out
    parts = [helper.make_node("Conv", [x, w, bias] if bias else [x, w], [conv_out], name=label, **attrs)]
    last = conv_out
    if z:
        add_out = names.new(f"{out}/add") if activation else out
        parts.append(helper.make_node("Add", [last, z], [add_out], name=f"{label}/Add" if label else ""))
        last = add_out
    constants: list[onnx.TensorProto] = []
    if activation:
        act_name = f"{label}/{activation}" if label else ""
        act_attrs: dict[str, Any] = {}
        inputs = [last]
        if activation == "LeakyRelu":
            act_attrs = {"alpha": params[0]}
        elif activation == "HardSigmoid":
            act_attrs = {"alpha": params[0], "beta": params[1]}
        elif activation == "Clip" and opset < _CLIP_INPUTS_OPSET:
            act_attrs = {"min": params[0], "max": params[1]}
        elif activation == "Clip":
            dtype = helper.tensor_dtype_to_np_dtype(types.get(w) or types.get(x) or onnx.TensorProto.FLOAT)
            for bound, value in (("min", params[0]), ("max", params[1])):
                constant = numpy_helper.from_array(np.array(value, dtype=dtype), names.new(f"{out}/clip_{bound}"))
                constants.append(constant)
                inputs.append(constant.name)
        parts.append(helper.make_node(activation, inputs, [out], name=act_name, **act_attrs))
    kind = (activation or "none") + ("+Z" if z else "")
    return parts, constants, kind


class _Names:
    """Tensor names not yet used anywhere in the model."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.used: set[str] = set()
        for graph in model_graphs(model):
            self.used.update(i.name for i in graph.input)
            self.used.update(t.name for t in graph.initializer)
            for node in graph.node:
                self.used.update(node.input)
                self.used.update(node.output)

    def new(self, base: str) -> str:
        name, k = base, 0
        while name in self.used:
            k += 1
            name = f"{base}_{k}"
        self.used.add(name)
        return name


def _element_types(model: onnx.ModelProto) -> dict[str, int]:
    """The element type the model states for each tensor it describes (initializers, inputs, value_info)."""
    types: dict[str, int] = {}
    for graph in model_graphs(model):
        for info in _infos(graph):
            if info.type.HasField("tensor_type") and info.type.tensor_type.elem_type:
                types[info.name] = info.type.tensor_type.elem_type
        types.update((t.name, t.data_type) for t in graph.initializer)
    return types


def _infos(graph: onnx.GraphProto) -> Iterator[onnx.ValueInfoProto]:
    yield from graph.input
    yield from graph.value_info
    yield from graph.output
