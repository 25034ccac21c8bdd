"""What TensorRT's strongly typed networks need of a model, checked: types, branches, Q/DQ, domains.

TensorRT 11 builds strongly typed networks only (10.x on request, ``NetworkDefinitionCreationFlag
.kSTRONGLY_TYPED``): every tensor's type is the one the ONNX file gives, through its Casts and typed
initializers, with no builder flag to pick precisions. What that asks of a model:

- every tensor's element type decided by the graph (:func:`undecided_values`): strict ONNX type
  inference derives it from the graph inputs, initializers and the ops' attributes;
- the outputs of an If's two branches of one type each, and a Loop's or Scan's carried values of one
  type across the body's inputs and outputs and the node's own (:func:`branch_faults`);
- FP8 Q/DQ as TensorRT's explicit quantization reads them (:func:`qdq_faults`): zero points absent
  or zero, scales constants of the type of the float side;
- ops onnx defines only (:func:`foreign_op_faults`): TensorRT's ONNX parser imports no onnxruntime
  contrib op (``com.microsoft``, or the ones onnxruntime registers in onnx's own domain); other ops
  are custom ops, which only a TensorRT plugin of the same name can take.

:func:`strongly_typed_faults` runs them all on a converted model (a model with foreign ops gets that
one fault: the others need onnx's strict inference, which does not know them). :func:`tensorrt_warnings` says,
before a conversion for TensorRT, which ops of the input its parser cannot import at all: one line
per kind (the engine build fails there, whatever the precision).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

import onnx
import onnx.shape_inference
import onnx_ir as ir

from amp_compiler.onnx.load.foreign_ops import foreign_ops
from amp_compiler.onnx.load.proto_walk import iter_proto_graphs
from amp_compiler.policy import schemas
from amp_compiler.policy.kernels import load_trt_snapshot

__all__ = [
    "branch_faults", "foreign_ops_of", "qdq_faults", "strongly_typed_faults", "tensorrt_warnings",
    "undecided_values",
]

_FP8 = frozenset({
    onnx.TensorProto.FLOAT8E4M3FN, onnx.TensorProto.FLOAT8E4M3FNUZ, onnx.TensorProto.FLOAT8E5M2,
    onnx.TensorProto.FLOAT8E5M2FNUZ,
})
_SHOWN = 4  # names shown per warning line


def undecided_values(model: onnx.ModelProto) -> list[str]:
    """Tensors of ``model`` (an ``onnx.ModelProto``) whose element type the graph does not fix.

    TensorRT 10's strongly typed networks take every tensor's type from the model, with no builder
    flag to pick precisions: each tensor must have a type that strict ONNX type inference derives
    from the graph inputs, initializers and the ops' attributes. Returns "graph/tensor" names of
    node outputs and graph inputs/outputs without one (empty for a model TensorRT can take as is).
    """
    inferred = _inferred(model)
    missing = []
    for graph in iter_proto_graphs(inferred.graph):
        typed = set(_types(graph))
        names = [v.name for v in list(graph.input) + list(graph.output)]
        names += [o for node in graph.node for o in node.output if o]
        missing += [f"{graph.name}/{n}" for n in names if n not in typed]
    return missing


def branch_faults(model: onnx.ModelProto) -> list[str]:
    """If nodes whose branches end in outputs of different types, and Loop/Scan nodes whose carried
    values change type between the node and its body, one line each (TensorRT's parser ties each If
    output to both branches' outputs, and a loop's state to one tensor type)."""
    faults = []
    for graph in iter_proto_graphs(_inferred(model, strict=False).graph):
        types = _types(graph)
        for node in graph.node:
            if node.op_type == "If" and schemas.is_onnx_domain(node.domain):
                faults += _if_faults(node, types)
            elif node.op_type in ("Loop", "Scan") and schemas.is_onnx_domain(node.domain):
                faults += _loop_faults(node, types)
    return faults


def qdq_faults(model: onnx.ModelProto) -> list[str]:
    """FP8 QuantizeLinear/DequantizeLinear nodes TensorRT's explicit quantization does not take: a
    zero point that is not all zeros, or a scale that is not a constant of the float side's type."""
    faults = []
    for graph in iter_proto_graphs(_inferred(model, strict=False).graph):
        types = _types(graph)
        constants = {t.name: t for t in graph.initializer}
        constants.update({n.output[0]: n.attribute[0].t for n in graph.node
                          if n.op_type == "Constant" and n.attribute and n.attribute[0].HasField("t")})
        for node in graph.node:
            if node.op_type not in ("QuantizeLinear", "DequantizeLinear") or not schemas.is_onnx_domain(node.domain):
                continue
            quantized = node.output[0] if node.op_type == "QuantizeLinear" else node.input[0]
            if types.get(quantized) not in _FP8:
                continue
            float_side = node.input[0] if node.op_type == "QuantizeLinear" else node.output[0]
            label = f"{node.op_type} {node.name or node.output[0]!r}"
            scale = node.input[1] if len(node.input) > 1 else ""
            if scale not in constants:
                faults.append(f"{label}: its scale is not a constant")
            elif types.get(scale) != types.get(float_side):
                faults.append(f"{label}: its scale's type is not its float side's")
            zero = node.input[2] if len(node.input) > 2 else ""
            if zero and (zero not in constants or onnx.numpy_helper.to_array(constants[zero]).astype(float).any()):
                faults.append(f"{label}: its zero point is not all zeros")
    return faults


def foreign_ops_of(model: onnx.ModelProto, custom: Iterable[tuple[str, str]] = ()) -> list[str]:
    """The ops of ``model`` onnx does not define, ``domain::op`` once each: onnxruntime contrib ops
    and custom ops, but those in ``custom`` ((domain, op) pairs a TensorRT plugin takes)."""
    allowed = set(custom)
    seen: dict[str, None] = {}
    for _, node, _ in foreign_ops(model).nodes:
        if (node.domain, node.op_type) not in allowed:
            seen.setdefault(f"{node.domain or 'ai.onnx'}::{node.op_type}")
    return list(seen)


def strongly_typed_faults(model: onnx.ModelProto, custom: Iterable[tuple[str, str]] = ()) -> list[str]:
    """Everything of the module doc that ``model`` breaks, one line each (empty: TensorRT can take it
    as a strongly typed network, as far as types, branches, Q/DQ and ops go)."""
    foreign = foreign_ops_of(model, custom)
    if foreign:
        return [f"ops onnx does not define, which TensorRT's ONNX parser does not import: {', '.join(foreign)}"]
    try:
        undecided = undecided_values(model)
    except onnx.shape_inference.InferenceError as exc:
        faults = [f"strict type inference fails: {str(exc).strip().splitlines()[-1]}"]
    else:
        faults = [f"no element type for {', '.join(undecided[:_SHOWN])}" + (" ..." if len(undecided) > _SHOWN else "")
                  ] if undecided else []
    return faults + branch_faults(model) + qdq_faults(model)


def tensorrt_warnings(model: ir.Model, declared: Collection[tuple[str, str]] = ()) -> list[str]:
    """What TensorRT's ONNX parser cannot import of ``model`` (its nodes in every graph), one line per
    kind: onnxruntime contrib ops; ONNX ops the parser's operator table does not import; custom ops
    whose precision nobody declared (``declared``: (domain, op) keys a plugin's types were given for)."""
    table = load_trt_snapshot()
    contrib: dict[str, None] = {}
    unimported: dict[str, None] = {}
    custom: dict[str, None] = {}
    opsets = model.opset_imports
    for graph in model.graphs():
        for node in graph:
            domain, op = node.domain or "", node.op_type
            if schemas.is_onnx_domain(domain) and table.has_op(domain, op):
                continue
            opset = schemas.opset_in(opsets, domain)
            if schemas.onnx_knows(domain, op, opset):
                unimported.setdefault(op if schemas.is_onnx_domain(domain) else f"{domain}::{op}")
            elif schemas.lookup(domain, op, opset) is not None:
                contrib.setdefault(f"{domain or 'ai.onnx'}::{op}")
            elif (domain, op) not in declared:
                custom.setdefault(f"{domain or 'ai.onnx'}::{op}")
    lines = []
    if contrib:
        lines.append(
            f"onnxruntime contrib ops ({_names(contrib)}): TensorRT's ONNX parser imports ONNX-domain ops only, so "
            "this graph is for onnxruntime (its TensorRT provider runs them on CUDA); for a TensorRT engine, "
            "convert the unfused export"
        )
    if unimported:
        lines.append(
            f"TensorRT {table.onnxruntime_version}'s ONNX parser does not import {_names(unimported)} (its operator "
            "table): the engine build fails there unless a plugin of that name is registered (onnxruntime's "
            "TensorRT provider runs them on CUDA)"
        )
    if custom:
        lines.append(
            f"custom ops ({_names(custom)}) keep their types (FP32, with Casts around them): a TensorRT plugin "
            "declares its output types, so say which with custom_op_precision (--custom-op-precision OP=fp16|bf16|fp32)"
        )
    return lines


def _names(found: Mapping[str, None]) -> str:
    names = list(found)
    return ", ".join(names[:_SHOWN]) + (f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")


def _inferred(model: onnx.ModelProto, *, strict: bool = True) -> onnx.ModelProto:
    """``model`` with inferred types: strict (an inconsistency raises ``InferenceError``), or each
    node inferred where it can be (the faults are then reported by who looks)."""
    return onnx.shape_inference.infer_shapes(model, check_type=strict, strict_mode=strict, data_prop=True)


def _types(graph: onnx.GraphProto) -> dict[str, int]:
    """The element type of every typed tensor of ``graph`` (0 for typed non-tensors: sequences, ...)."""
    out: dict[str, int] = {}
    for v in list(graph.input) + list(graph.output) + list(graph.value_info):
        kind = v.type.WhichOneof("value")
        if kind is None:
            continue
        elem = v.type.tensor_type.elem_type if kind == "tensor_type" else 0
        if kind != "tensor_type" or elem != onnx.TensorProto.UNDEFINED:
            out[v.name] = elem
    out.update({t.name: t.data_type for t in graph.initializer})
    out.update({t.values.name: t.values.data_type for t in graph.sparse_initializer})
    return out


def _type_name(elem: int | None) -> str:
    return "unknown" if not elem else onnx.TensorProto.DataType.Name(elem).lower()


def _if_faults(node: onnx.NodeProto, types: Mapping[str, int]) -> list[str]:
    branches = {a.name: a.g for a in node.attribute if a.name in ("then_branch", "else_branch")}
    if len(branches) != 2:
        return []
    then_types, else_types = (_types(branches[b]) for b in ("then_branch", "else_branch"))
    faults = []
    for i, out in enumerate(node.output):
        then_out, else_out = branches["then_branch"].output[i].name, branches["else_branch"].output[i].name
        got = (then_types.get(then_out, types.get(then_out)), else_types.get(else_out, types.get(else_out)),
               types.get(out))
        if len(set(got)) > 1:
            faults.append(
                f"If {node.name or out!r} output {i}: then {_type_name(got[0])}, else {_type_name(got[1])}, "
                f"the If's {_type_name(got[2])}"
            )
    return faults


def _loop_faults(node: onnx.NodeProto, types: Mapping[str, int]) -> list[str]:
    """Loop: body inputs (iteration, condition, carried...) and outputs (condition, carried..., scan
    outputs); Scan: body inputs (states..., scan inputs) and outputs (states..., scan outputs)."""
    body = next((a.g for a in node.attribute if a.name == "body"), None)
    if body is None:
        return []
    body_types = _types(body)
    loop = node.op_type == "Loop"
    skip_in, skip_out = (2, 1) if loop else (0, 0)
    first_input = 2 if loop else 0
    carried = len(node.input) - first_input if loop else len(node.input) - _scan_inputs(node)
    faults = []
    for k in range(max(carried, 0)):
        got = (
            types.get(node.input[first_input + k]) if node.input[first_input + k] else None,
            body_types.get(body.input[skip_in + k].name) if skip_in + k < len(body.input) else None,
            body_types.get(body.output[skip_out + k].name) if skip_out + k < len(body.output) else None,
            types.get(node.output[k]) if k < len(node.output) else None,
        )
        known = {t for t in got if t}
        if len(known) > 1:
            where = ("input", "body input", "body output", "output")
            faults.append(
                f"{node.op_type} {node.name or node.output[0]!r} carried value {k}: "
                + ", ".join(f"{w} {_type_name(t)}" for w, t in zip(where, got, strict=True))
            )
    return faults


def _scan_inputs(node: onnx.NodeProto) -> int:
    return next((a.i for a in node.attribute if a.name == "num_scan_inputs"), 0)
