"""FP8 statistics per Tensor Core op: which GEMMs may take FP8 (E4M3) inputs, their scales, and the
error FP8 inputs add on the calibration samples.

Guarantees:
- :func:`fp8_candidates` lists the main graph's MatMul, Gemm and Conv nodes whose two data inputs
  are FP32 and either constant (a weight: scales per output channel, from its values, margin 0) or
  observed in calibration (an activation: one scale per tensor, ``amax * 2^margin / 448``, amax the
  observed max of |x| or the one given, a percentile: :mod:`amp_compiler.onnx.fp8.scales`). Scales are
  values of the fallback type (FP16 or BF16: what the Q/DQ nodes store), never 0, inf or out of its
  normal range.
- :func:`measure_candidates` runs one probe model (the FP32 model plus, per candidate, the op on
  FP8-quantized inputs and on FP16-rounded inputs, reduced to sums) over the samples, through a
  :class:`~amp_compiler.runtime.runner.Runner`, and returns per candidate the relative L2 error of its output
  with FP8 inputs against FP16 inputs and the share of nonzero scaled activation values below FP8's
  smallest normal (2^-6). The FP8 side computes exactly what the converted model's Q/DQ nodes do
  (:mod:`amp_compiler.onnx.measure.fp8_view`), the other side what the fallback type (the scales' type) holds.
- :func:`fp8_choice` is whether a candidate goes to FP8 by those statistics, with its reason's parts
  (:class:`amp_compiler.core.fp8_choice.LocalChoice`).
"""

from __future__ import annotations

import math
import types
from collections.abc import Iterable, Mapping

import numpy as np
import onnx
import onnx.helper as oh
import onnx_ir as ir

from amp_compiler.core.fp8_choice import Fp8Stats, LocalChoice
from amp_compiler.core.fp8_numbers import Fp8Format, scale_for_amax, weight_scales
from amp_compiler.core.measures import TensorRange
from amp_compiler.onnx.fp8.scales import channel_axis
from amp_compiler.onnx.measure.fp8_view import fp8_view
from amp_compiler.passes.onnx.qdq import Fp8Candidate, Fp8Input
from amp_compiler.policy import default_table
from amp_compiler.policy.schemas import is_onnx_domain
from amp_compiler.runtime.runner import Runner
from amp_compiler.targets import Target

__all__ = ["FP8_GEMM_INPUTS", "fp8_candidates", "fp8_choice", "measure_candidates"]

# The Tensor Core ops that take FP8 inputs through Q/DQ (TensorRT's explicit quantization), and the
# positions of their data inputs (bias inputs stay FP16): the policy table's ``fp8_inputs``.
FP8_GEMM_INPUTS: Mapping[str, tuple[int, ...]] = types.MappingProxyType(
    {e.op: e.fp8_inputs for e in default_table() if e.fp8_inputs and is_onnx_domain(e.domain)}
)


def fp8_candidates(
    model: ir.Model, ranges: Mapping[str, TensorRange], margin: int, *, low: Target = Target.FP16,
    amax: Mapping[str, float] | None = None, calibration: str = "amax", skipped: dict[int, str] | None = None,
) -> list[Fp8Candidate]:
    """The main graph's FP8 candidates with their scales in ``low`` (see module doc); ``amax``:
    activations' amax by tensor name (default: the observed max of |x| in ``ranges``), described
    as ``calibration`` in the reasons. ``skipped`` (if given) receives, by ``id`` of the node, why a
    main-graph MatMul/Gemm/Conv is no candidate."""
    out = []
    for node in model.graph:
        positions = FP8_GEMM_INPUTS.get(node.op_type)
        if positions is None or not is_onnx_domain(node.domain):
            continue
        found = _candidate(node, positions, ranges, margin, low, amax, calibration)
        if isinstance(found, Fp8Candidate):
            out.append(found)
        elif skipped is not None:
            skipped[id(node)] = found
    return out


def _candidate(
    node: ir.Node, positions: tuple[int, ...], ranges: Mapping[str, TensorRange], margin: int, low: Target,
    amax: Mapping[str, float] | None, calibration: str,
) -> Fp8Candidate | str:
    """The candidate with its scales, or why ``node`` is none."""
    inputs = []
    for i in positions:
        value = node.inputs[i] if i < len(node.inputs) else None
        if value is None or not value.name:
            return f"input {i} is absent"
        if value.dtype != ir.DataType.FLOAT:
            return f"input {i} ({value.name}) is {value.dtype.name if value.dtype else 'untyped'}, not FP32"
        const = ir.convenience.get_const_tensor(value)
        if const is not None:
            weight = const.numpy().astype(np.float32)
            axis = channel_axis(node, i, weight.ndim)
            inputs.append(Fp8Input(i, value.name, weight_scales(weight, axis, dtype=low.numpy_dtype), axis, weight,
                                   float(np.max(np.abs(weight), initial=0.0))))
            continue
        seen = ranges.get(value.name)
        if seen is None:
            return f"input {i} ({value.name}) was not observed on the calibration data"
        if not math.isfinite(seen.absmax):
            return f"input {i} ({value.name}) reached inf or NaN on the calibration data"
        given = amax.get(value.name) if amax is not None else None
        peak, how = (given, calibration) if given is not None else (seen.absmax, "amax")
        scale = scale_for_amax(peak, margin=margin, dtype=low.numpy_dtype)
        inputs.append(Fp8Input(i, value.name, scale, amax=peak, calibration=how))
    return Fp8Candidate(node, tuple(inputs))


def _probe(model: onnx.ModelProto, candidates: list[Fp8Candidate]) -> tuple[onnx.ModelProto, list[str]]:
    """The FP32 model with, per candidate, its op on FP8 and on FP16 inputs, reduced to four sums
    (error^2, reference^2, scaled values below FP8's smallest normal, nonzero scaled values): the
    graph's outputs."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    graph = probe.graph
    del graph.output[:]
    nodes, inits, outputs = [], [], []
    f32 = onnx.TensorProto.FLOAT
    normal = np.asarray(Fp8Format.E4M3.smallest_normal, dtype=np.float32)
    inits.append(onnx.numpy_helper.from_array(normal, "fp8probe_normal"))
    inits.append(onnx.numpy_helper.from_array(np.zeros((), dtype=np.float32), "fp8probe_zero"))
    for k, cand in enumerate(candidates):
        p = f"fp8probe{k}_"
        proto = ir.serde.serialize_node(cand.node)
        ins8, ins16 = list(proto.input), list(proto.input)
        below, nonzero = [], []
        for inp in cand.inputs:
            view = fp8_view(inp, f"{p}{inp.index}_")
            nodes += view.nodes
            inits += view.initializers
            ins8[inp.index], ins16[inp.index] = view.fp8, view.fp16
            if inp.weight is not None:
                continue
            a, s = f"{p}a{inp.index}", view.scale
            nodes += [
                oh.make_node("Div", [view.fp16, s], [a + "sc"]),
                oh.make_node("Abs", [a + "sc"], [a + "abs"]),
                oh.make_node("Less", [a + "abs", "fp8probe_normal"], [a + "lt"]),
                oh.make_node("Greater", [a + "abs", "fp8probe_zero"], [a + "nz"]),
                oh.make_node("And", [a + "lt", a + "nz"], [a + "sub"]),
                oh.make_node("Cast", [a + "sub"], [a + "subf"], to=f32),
                oh.make_node("Cast", [a + "nz"], [a + "nzf"], to=f32),
                oh.make_node("ReduceSum", [a + "subf"], [a + "nsub"], keepdims=0),
                oh.make_node("ReduceSum", [a + "nzf"], [a + "nnz"], keepdims=0),
            ]
            below.append(a + "nsub")
            nonzero.append(a + "nnz")
        for j, name in enumerate(proto.input):  # bias inputs: FP16 (BF16) values on both sides
            if name and j not in FP8_GEMM_INPUTS[cand.node.op_type]:
                nodes += [oh.make_node("Cast", [name], [f"{p}b{j}h"], to=cand.inputs[0].low_type),
                          oh.make_node("Cast", [f"{p}b{j}h"], [f"{p}b{j}"], to=f32)]
                ins8[j] = ins16[j] = f"{p}b{j}"
        attrs = list(proto.attribute)
        for tag, ins in (("y8", ins8), ("y16", ins16)):
            node = oh.make_node(proto.op_type, ins, [p + tag], domain=proto.domain)
            node.attribute.extend(attrs)
            nodes.append(node)
        nodes += [
            oh.make_node("Sub", [p + "y8", p + "y16"], [p + "d"]),
            oh.make_node("ReduceSumSquare", [p + "d"], [p + "err2"], keepdims=0),
            oh.make_node("ReduceSumSquare", [p + "y16"], [p + "ref2"], keepdims=0),
        ]
        sums = [p + "err2", p + "ref2"]
        for tag, names in (("nsub", below), ("nnz", nonzero)):
            if names:
                nodes.append(oh.make_node("Sum", names, [p + tag]))
            else:
                nodes.append(oh.make_node("Identity", ["fp8probe_zero"], [p + tag]))
            sums.append(p + tag)
        outputs += sums
    graph.node.extend(nodes)
    graph.initializer.extend(inits)
    graph.output.extend(oh.make_tensor_value_info(name, f32, []) for name in outputs)
    return probe, outputs


def measure_candidates(
    model: onnx.ModelProto, candidates: list[Fp8Candidate], samples: Iterable[dict[str, np.ndarray]],
    runner: Runner,
) -> list[Fp8Stats]:
    """Per candidate, its :class:`Fp8Stats` over ``samples`` (``model``: the FP32 model the
    candidates' nodes come from, at opset 19 or later)."""
    if not candidates:
        return []
    probe, names = _probe(model, candidates)
    session = runner.load(probe)
    try:
        totals = np.zeros(len(names), dtype=np.float64)
        for sample in samples:
            feeds = {k: v for k, v in sample.items() if k in session.input_names}
            totals += np.asarray([float(np.asarray(v)) for v in session.run(feeds)], dtype=np.float64)
    finally:
        session.close()
    return [Fp8Stats.from_sums(*(float(t) for t in totals[4 * k : 4 * k + 4])) for k in range(len(candidates))]


def fp8_choice(cand: Fp8Candidate, stats: Fp8Stats, max_error: float, max_subnormal: float) -> LocalChoice:
    """The candidate's choice by its statistics, with how its inputs are scaled, as data."""
    acts = [i for i in cand.inputs if i.weight is None]
    weights = [i for i in cand.inputs if i.weight is not None]
    scales = [f"input {i.index} scale {float(i.scale):.3g} per tensor ({i.calibration} {i.amax:.3g})" for i in acts]
    scales += [
        f"weight {i.index} scales per output channel (axis {i.axis})" if i.axis is not None
        else f"weight {i.index} scale {float(i.scale):.3g} per tensor" for i in weights
    ]
    return LocalChoice(stats, max_error, max_subnormal, tuple(scales), cand.inputs[0].low_name, " through Q/DQ")
