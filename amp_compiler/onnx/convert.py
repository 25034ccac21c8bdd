"""The ONNX conversion, :func:`convert`: the pipeline from an FP32 model to a mixed-precision one.

    load -> onnxruntime's FusedConvs, FusedGemms split into Conv, Gemm + activation (amp_compiler.onnx.load.fused_ops)
    -> check and type the IR (shape inference, then the ops' schemas) -> static ranges (from the
    inputs' known ranges) -> precision graph -> analysis (classify, kernel coverage, signal
    paths, quantized islands, constant, static and calibration ranges, runtime hazards, paint,
    min-cut, final kernels: amp_compiler.passes.analysis.pipeline) -> lower (casts, constants) -> cleanup
    -> Tensor Core padding
    (opt-in) -> per-node decisions (nodes left as they are for want of an element type: a warning,
    or with ``strict`` an error), and warnings of overflows that depend on the scale of an input
    whose range is not known, and of nodes whose final types the provider has no kernel for
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx

from amp_compiler import runtime
from amp_compiler.core.decision import NodeDecision, untyped_message, untyped_nodes
from amp_compiler.core.gc_pause import gc_paused
from amp_compiler.core.measures import TensorRange
from amp_compiler.core.plan import Rule
from amp_compiler.errors import ModelRunError, RunBudgetError, UntypedTensorsError
from amp_compiler.onnx.costs.costs import bind_input_shapes, placement_elements
from amp_compiler.onnx.fp8.steps import fp8_decisions, lower_fp8, plan_fp8, require_samples, weights_in_memory
from amp_compiler.onnx.graph.custom_ops import declared_types
from amp_compiler.onnx.graph.input_scale import weight_scale_warnings
from amp_compiler.onnx.graph.intervals import known_input_ranges, overflow_warnings, reached_magnitudes, static_bounds
from amp_compiler.onnx.graph.precision_graph import build_precision_graph
from amp_compiler.onnx.ir.walk import node_order
from amp_compiler.onnx.load.deferred import DeferredModel, defer_ir_tensors, with_small_weights
from amp_compiler.onnx.load.files import load_model_deferred
from amp_compiler.onnx.load.foreign_ops import foreign_ops
from amp_compiler.onnx.load.fused_ops import split_fused_ops
from amp_compiler.onnx.load.node_order import in_topological_order
from amp_compiler.onnx.load.opset import OpsetChange, for_bf16, fp8_opset, raise_opset
from amp_compiler.onnx.load.sparse import densify
from amp_compiler.onnx.load.structure import NodeOrderError
from amp_compiler.onnx.load.text import first_line
from amp_compiler.onnx.load.typed import checked_typed_ir as _checked_typed_ir
from amp_compiler.onnx.measure.calibrate import collect_ranges
from amp_compiler.onnx.measure.emulate import emulate, stores_low_precision
from amp_compiler.onnx.measure.output_error import output_accuracy, worst_accuracy
from amp_compiler.onnx.measure.range_probe import (
    ProbeSkipped,
    RangeProbe,
    probe_ranges,
)
from amp_compiler.onnx.probe_model import model_to_probe, outputs_only
from amp_compiler.onnx.write.check_pieces import value_types
from amp_compiler.onnx.write.decisions import node_decisions
from amp_compiler.onnx.write.output import DeferredOutput as _DeferredOutput
from amp_compiler.onnx.write.output import output_proto as _output_proto
from amp_compiler.onnx.write.result import ConversionResult
from amp_compiler.onnx.write.strongly_typed import tensorrt_warnings
from amp_compiler.onnx.write.tf32 import kept_for_precision, tf32_warnings
from amp_compiler.options import (
    ConvertOptions,
    check_allow_ops,
    check_block_ops,
    check_custom_op_precision,
    check_fallback,
    check_fp8_options,
    check_keep_io_types,
    check_target_provider,
    range_fallback,
    resolve_options,
)
from amp_compiler.passes.analysis import UserChoices, compile_patterns
from amp_compiler.passes.analysis.final_kernels import no_kernel_warnings
from amp_compiler.passes.analysis.hazards import stand_in_skips
from amp_compiler.passes.analysis.mincut import unshaped_tensors
from amp_compiler.passes.analysis.pipeline import AnalysisSettings, check_placement, plan_precisions
from amp_compiler.passes.analysis.raw_offsets import raw_offset_warnings
from amp_compiler.passes.onnx import (
    LowerPlanPass,
    PadTensorCoresPass,
    RemoveCancellingCastsPass,
    ScaledProductsPass,
    SplitProductsPass,
)
from amp_compiler.policy import PolicyTable, default_table
from amp_compiler.runtime.runner import ChildRunner, Runner, default_runner
from amp_compiler.targets import Provider, Target

__all__ = ["ConversionResult", "ConvertOptions", "NodeDecision", "convert"]

#: What a conversion's output error is measured against when its input stores FP16/BF16 already.
ALREADY_LOW_REFERENCE = "the input model (it stores fp16/bf16 already: no FP32 reference)"


@gc_paused
def convert(
    model: onnx.ModelProto | str | os.PathLike | DeferredModel,
    options: ConvertOptions | None = None,
    *,
    policy: PolicyTable | None = None,
    ranges: dict[str, TensorRange] | None = None,
    samples: Sequence[dict[str, np.ndarray]] | None = None,
    runner: Runner | None = None,
    **overrides,
) -> ConversionResult:
    """Convert an FP32 ONNX model to mixed precision.

    ``model`` is an ``onnx.ModelProto``, a path, or a :class:`~amp_compiler.onnx.load.deferred.DeferredModel`.
    A model file with external data is read lazily: its large weights stay on disk and are read one
    at a time when needed, and :meth:`ConversionResult.save` writes the result with external data.
    ``options`` (or keyword overrides of its fields, e.g. ``target="bf16"``) choose the target,
    provider and user overrides. ``ranges`` (from :func:`amp_compiler.onnx.measure.calibrate.collect_ranges`) adds
    the calibration rules, and the graph inputs' observed ranges feed the static range analysis like
    stated ones (``input_ranges``). Returns the converted model with the per-node decisions. The input model
    is not modified.

    ``samples`` (calibration inputs, e.g. from :func:`amp_compiler.runtime.samples.load_samples`) without
    ``ranges``: their observed ranges (:func:`~amp_compiler.onnx.measure.calibrate.collect_ranges`) instead of
    the range probe's, and the written model's output error measured on them.
    ``target="fp8"`` needs ``samples`` (calibration inputs, e.g. from
    :func:`amp_compiler.runtime.samples.load_samples`): MatMul/Gemm/Conv whose statistics on them allow it read
    FP8 E4M3 inputs through Q/DQ, everything else follows the FP16 policy, or the BF16 one with
    ``fallback="bf16"`` (:mod:`amp_compiler.onnx.fp8.steps`);
    ``runner`` is where the samples run (default: a child process with the default budget).
    """
    # Options, checked before the model is read.
    opts = resolve_options(options, overrides)
    policy = policy or default_table()
    check_block_ops(opts.block_ops, policy)
    check_allow_ops(opts, policy)
    patterns = compile_patterns(opts.block_nodes)
    allow_patterns = compile_patterns(opts.allow_nodes, option="allow_nodes")
    check_placement(opts.placement)
    check_fallback(opts)
    check_target_provider(opts)
    check_custom_op_precision(opts.custom_op_precision)
    range_fallback(opts)  # checked before the model is read
    fp8 = opts.target is Target.FP8
    if fp8:
        check_fp8_options(opts)
        samples = require_samples(samples)

    # The child that will run the model starts now: its start (importing onnxruntime, 0.17 s) overlaps
    # reading and checking the model, where it was waited for when the probe began (ppocr-v4-det's
    # conversion: at 0.18 s of its 2.0 s).
    early = _early_runner(runner, opts, samples, ranges)
    try:
        return _convert(model, opts, policy, patterns, allow_patterns, ranges, samples, early or runner, fp8)
    finally:
        if early is not None:
            early.close()


def _early_runner(
    runner: Runner | None, opts: ConvertOptions, samples: Sequence[dict[str, np.ndarray]] | None,
    ranges: dict[str, TensorRange] | None,
) -> ChildRunner | None:
    """A :class:`ChildRunner` with the default budget where the conversion will run the model (a range
    probe, calibration samples, FP8's statistics) and the caller gave no runner; else None."""
    if runner is not None or not runtime.is_installed():
        return None
    runs = opts.target is Target.FP8 or (ranges is None and (bool(samples) or opts.probe))
    return ChildRunner() if runs else None


def _convert(
    model: onnx.ModelProto | str | os.PathLike | DeferredModel, opts: ConvertOptions, policy: PolicyTable,
    patterns: tuple[re.Pattern, ...], allow_patterns: tuple[re.Pattern, ...], ranges: dict[str, TensorRange] | None,
    samples: Sequence[dict[str, np.ndarray]] | None, runner: Runner | None, fp8: bool,
) -> ConversionResult:
    """:func:`convert` once its options are checked (``patterns``, ``allow_patterns``: the compiled block and
    allow node patterns; ``runner``: where the model runs, if the caller or :func:`_early_runner` gave one)."""
    # Load, check the model and type its IR; weights of external-data models stay on disk.
    source = _read(model, all_weights=fp8)
    # CUDA's FusedConv is FP32-only, FusedGemm absent; Conv, Gemm take FP16
    fused = split_fused_ops(source.model, kept=opts.block_ops)
    if fused.split:  # positions, names and shapes all refer to the split model
        source = dataclasses.replace(source, model=fused.model, checked=False)
    proto, locations, checked, origin = source.model, source.locations, source.checked, str(source.files[0])
    opset = None
    if fp8:
        proto, checked = raise_opset(proto, fp8_opset(opts.low_target)), False
    elif opts.target is Target.BF16:  # Conv takes bfloat16 from opset 22
        opset = for_bf16(proto, opts.provider)
        proto, checked = opset.model, checked and opset.model is proto
    check_keep_io_types(opts.keep_io_types, (i.name for i in proto.graph.input), (o.name for o in proto.graph.output))
    shapes = bind_input_shapes(proto, dict(opts.input_shapes)) if opts.input_shapes else {}
    order_note = ""
    try:
        ir_model = _checked_typed_ir(proto, origin, deferred=bool(locations), check=not checked)
    except NodeOrderError:  # refused for the order of its nodes alone: sorted (nothing it computes changes)
        proto, order_note = in_topological_order(proto)
        if not order_note:
            raise
        ir_model = _checked_typed_ir(proto, origin, deferred=bool(locations), check=True)
    if locations:
        defer_ir_tensors(ir_model, locations, inline=source.inline)
    declared = declared_types(ir_model, opts.custom_op_precision)
    # TensorRT: what its ONNX parser cannot import, whatever the precision (one line per kind).
    provider_warnings = tensorrt_warnings(ir_model, declared) if opts.provider is Provider.TENSORRT else []

    # FP8: the per-layer choice, on the FP32 model; the FP16 pipeline then runs as for fp16.
    fp8_plan = None
    if fp8:
        in_memory = weights_in_memory(proto, origin) if locations else proto  # what the probes run
        fp8_plan, ranges = plan_fp8(ir_model, in_memory, list(samples or ()), ranges, opts, runner)
        del in_memory

    # Calibration inputs given for another target than FP8: their observed ranges, as --calibration-data's,
    # in the runner (one process) that then measures the written model on them.
    calibration: onnx.ModelProto | None = None
    model_runner: tuple[Runner, bool] | None = None  # where the calibration samples or the probe run
    if samples and ranges is None and not fp8:
        samples = list(samples)
        calibration = weights_in_memory(proto, origin) if locations else proto
        model_runner = default_runner(runner)
        try:
            ranges = collect_ranges(calibration, samples, runner=model_runner[0])
        except BaseException:
            if model_runner[1]:
                model_runner[0].close()
            raise

    # The range probe: without calibration ranges, the FP32 model's ranges on generated inputs.
    probe: RangeProbe | None = None
    probe_skipped = ""
    probe_model: onnx.ModelProto | None = None
    if opts.probe and ranges is None and not fp8:
        probe_model, probe_skipped = model_to_probe(proto, origin, locations)
        if probe_model is not None:
            model_runner = default_runner(runner)
            try:
                probe = probe_ranges(probe_model, model_runner[0], input_shapes=shapes or None,
                                     input_ranges=dict(opts.input_ranges))
            except ProbeSkipped as exc:
                probe_skipped = str(exc)
            except BaseException:
                if model_runner[1]:
                    model_runner[0].close()
                raise
        if probe_model is not None and probe_model is not proto and not stores_low_precision(probe_model):
            probe_model = outputs_only(probe_model)  # the FP32 outputs are in hand: its weights' copy goes
    try:
        result = _convert_ranged(
            source, proto, ir_model, locations, origin, checked, shapes, opts, policy, patterns, allow_patterns,
            fp8_plan, probe.ranges if probe is not None else ranges, probe, probe_skipped, probe_model,
            model_runner[0] if model_runner and probe is not None else None, declared, provider_warnings,
        )
        if calibration is not None and model_runner is not None:
            _measure_on(result, calibration, list(samples or ()), model_runner[0])
    finally:
        if model_runner is not None and model_runner[1]:
            model_runner[0].close()
    if opset is not None:
        _say_opset(result, opset)
    result.node_order = order_note
    result.fused_split = fused.note
    if stores_low_precision(proto):  # whatever measures the output's error (the probe, the report) has no FP32
        result.reference = ALREADY_LOW_REFERENCE
    if fp8 and samples:  # the FLOPs the summary states are at the data's sizes, as --tolerance's are
        result.sample_shapes = {k: tuple(v.shape) for k, v in samples[0].items()}
    return result


def _say_opset(result: ConversionResult, opset: OpsetChange) -> None:
    """The summary's note of a raised opset; where it could not be raised, a warning naming the Tensor
    Core ops that keep FP32 for it."""
    result.opset_change = opset.note
    if not opset.refused:
        return
    policy = default_table()
    kept = [d.node or d.op_type for d in result.decisions
            if d.rule == Rule.FIXED.value and d.precision == "fp32" and policy.is_tensor_core(d.domain, d.op_type)]
    if kept:
        result.provider_warnings.append(
            f"{len(kept)} Tensor Core op(s) keep FP32 ({', '.join(kept[:3])}{' ...' if len(kept) > 3 else ''}): "
            f"their schema at opset {opset.before} takes no bfloat16, and {opset.refused}")


def _convert_ranged(
    source: DeferredModel, proto: onnx.ModelProto, ir_model, locations, origin: str, checked: bool,
    shapes: dict[str, tuple[int, ...]], opts: ConvertOptions, policy: PolicyTable, patterns, allow_patterns,
    fp8_plan, ranges: dict[str, TensorRange] | None, probe: RangeProbe | None, probe_skipped: str,
    probe_model: onnx.ModelProto | None, runner: Runner | None, declared, provider_warnings: list[str],
) -> ConversionResult:
    """The conversion from the static ranges on, with ``ranges`` (calibration's, or the probe's)."""
    # Static ranges: what the graph inputs' known ranges (stated, or observed in calibration data) bound;
    # generated inputs' ranges are no bound (the probe's ranges do not feed it).
    stated = dict(opts.input_ranges)
    input_ranges = known_input_ranges(ir_model, stated, None if probe is not None else ranges)
    bounds = static_bounds(ir_model, input_ranges) if input_ranges else {}
    # The stated ranges' bounds alone: a guarantee range scaling holds in every channel (calibration's
    # ranges are the data's own, whose channel peaks say more than one box for every channel).
    stated_bounds = bounds if input_ranges.keys() == stated.keys() else (
        static_bounds(ir_model, stated) if stated else {})
    target = opts.low_target
    # FP8: its GEMM choice reads the FP16 plan's Tensor Core ops as they are; scaled ones take BF16
    fallback = range_fallback(opts)
    fallback = "bf16" if opts.target is Target.FP8 and fallback == "scaled" else fallback

    # Analysis: the precision graph, then the plan (amp_compiler.passes.analysis.pipeline). Cast sizes for placement
    # where onnx's inference gives no shape (ops it does not define) come from symbolic inference.
    graph = build_precision_graph(ir_model, target, policy, keep_io_types=opts.keep_io_types, declared=declared)
    nodes = node_order(ir_model)
    mincut = opts.placement == "mincut"
    unshaped = unshaped_tensors(graph) if mincut else set()
    if unshaped and not foreign_ops(proto).nodes:
        unshaped = set()  # onnx's inference had its say: symbolic inference adds nothing worth its time
    settings = AnalysisSettings(
        target, opts.provider, opts.block_ops, patterns, opts.allow_ops, allow_patterns,
        pinned={nodes[i]: why for i, why in opts.pinned_nodes if i < len(nodes)},
        kept={nodes[i]: why for i, why in opts.kept_nodes if i < len(nodes)},
        ranges=ranges,
        ranges_generated=probe is not None,
        placement=opts.placement,
        range_fallback=fallback,
        reached=reached_magnitudes(bounds) or None,
        stated_reached=reached_magnitudes(stated_bounds) or None,
        elements=(
            placement_elements(with_small_weights(source), unshaped, shapes)
            if mincut and (shapes or unshaped) else None
        ),
    )
    plan = plan_precisions(graph, settings)
    user = UserChoices(opts.block_ops, patterns, opts.allow_ops, allow_patterns)
    allowed = tuple(i for i, n in enumerate(nodes) if user.allows(n.op_type, n.name or "")) if (
        opts.allow_ops or opts.allow_nodes) else ()
    unranged = [v.name for v in ir_model.graph.inputs if v.name and v.name not in input_ranges]
    warnings = overflow_warnings(ir_model, graph, plan, target, unranged)
    if probe is not None or ranges is None:  # no value of the user's seen: what the weights say of the inputs
        lowered = {id(v.node) for v in graph.vertices
                   if v.node is not None and plan.decisions[v.id].dtype == target.dtype}
        warnings = [*weight_scale_warnings(ir_model, unranged, target.max, lambda n: id(n) in lowered), *warnings]
        # an offset a first product's bias may cancel: a stated range (one box for every feature) says nothing of it
        warnings = [*raw_offset_warnings(graph, plan, {v.name for v in ir_model.graph.inputs if v.name}), *warnings]

    # no-kernel warnings first: lowering rewires the nodes whose types they look up (a OneHot's int32 depth lost its)
    kernel_lines = no_kernel_warnings(graph, plan, opts.provider, fallback)
    # Lowering: the plan applied to the IR, then cleanup and the opt-in Tensor Core padding.
    lower = LowerPlanPass(graph, plan)
    lower(ir_model)
    scale = ScaledProductsPass(graph, plan) if plan.scalings else None
    if scale is not None:
        scale(ir_model)
    RemoveCancellingCastsPass()(ir_model)
    pad = PadTensorCoresPass(policy=policy) if opts.pad_tensor_cores else None
    if pad is not None:
        pad(ir_model)
    fp8_lowering = lower_fp8(ir_model, fp8_plan) if fp8_plan is not None else None
    split = SplitProductsPass(kept_for_precision(graph, plan)) if opts.fp32_products == "split" else None
    if split is not None:
        split(ir_model)
    skips = stand_in_skips(ir_model, opts.provider)  # what only the load check's CPU provider trips on

    # Decisions, one per node of the output (positions of the input's nodes), and the result.
    decisions = node_decisions(graph, plan, ir_model, lower.casts, nodes, pad.renames() if pad is not None else None)
    if pad is not None or scale is not None or split is not None:
        order = node_order(ir_model)
        for explaining in (pad, scale, split):
            if explaining is not None:
                explaining.explain(decisions, order)
    if fp8_plan is not None and fp8_lowering is not None:
        decisions = fp8_decisions(decisions, ir_model, fp8_plan, fp8_lowering, policy)
    untyped = untyped_nodes(decisions)
    if opts.strict and untyped:
        raise UntypedTensorsError(untyped_message(untyped))
    inserted = sum(d.rule == Rule.LOWERING_CAST.value for d in decisions)
    kept = sum(d.op_type == "Cast" and d.index is not None for d in decisions)  # the input's own: they have a position
    types = value_types(ir_model)  # before the output drops the types the input did not describe
    output = _DeferredOutput(ir_model, proto, source.inline) if locations else None
    result = ConversionResult(
        None if output else _output_proto(ir_model, proto), decisions, inserted,  # type: ignore[arg-type]
        len(lower.converted_constants), opts, plan.cast_bytes_painting, plan.cast_bytes_final, output,
        casts_removed=sum(n.op_type == "Cast" for n in nodes) - kept, untyped_nodes=untyped,
        input_shapes=shapes, warnings=warnings, value_types=types, allowed=allowed,
        provider_warnings=[
            *provider_warnings,
            *kernel_lines,
            *tf32_warnings(decisions, opts.provider, split.positions if split else (),
                           [i for i, n in enumerate(nodes) if n in plan.no_kernel]),
        ],
        load_check_skips=skips, probe_skipped=probe_skipped,
    )
    if probe is not None and probe_model is not None and runner is not None:
        _measure(result, probe, probe_model, runner)
    return result


def _measure(result: ConversionResult, probe: RangeProbe, fp32: onnx.ModelProto, runner: Runner) -> None:
    """The written model's output error on the probe's inputs, against the FP32 outputs the probe kept
    (one run of the emulated model per sample): per output, on the sample where it is worst, and
    which kind that sample is when they differ (an image model's noise and dead leaves)."""
    result.probe_inputs, result.probe_runs, result.probe_dims = probe.inputs, probe.runs, probe.dims
    result.probe_shapes = {k: tuple(v.shape) for k, v in probe.samples[0].items()}
    reference: onnx.ModelProto = fp32
    refs: list[list[np.ndarray]] | None = probe.outputs
    if stores_low_precision(fp32):  # an input already partly FP16/BF16: exact emulation of it is the reference
        reference, refs = emulate(fp32), None
    try:
        worst = worst_accuracy(reference, result.model, probe.samples, runner, refs)
        result.accuracy = [a for a, _ in worst]
        result.accuracy_on = {a.name: probe.kinds[i] for a, i in worst} if probe.kinds else {}
        result.probe_runs += len(probe.samples)
    except RunBudgetError as exc:
        result.accuracy_not_measured = first_line(exc)
    except ModelRunError as exc:  # the FP32 outputs are the probe's: the written model is what failed
        result.accuracy_not_measured = (
            f"the written model does not run on generated inputs the FP32 model runs on ({first_line(exc)})")


def _measure_on(result: ConversionResult, fp32: onnx.ModelProto, samples: list[dict[str, np.ndarray]],
                runner: Runner) -> None:
    """The written model's output error on the calibration ``samples`` the conversion was given."""
    try:
        result.accuracy = output_accuracy(fp32, result.model, samples, runner)
    except ModelRunError as exc:
        result.accuracy_not_measured = first_line(exc)


def _read(model: onnx.ModelProto | str | os.PathLike | DeferredModel, *, all_weights: bool = False) -> DeferredModel:
    """The model as a :class:`DeferredModel` (``files`` starting with its origin for messages): a
    path is read with its large weights left on disk, unchecked (the conversion checks it while it
    builds the IR); sparse tensors are made dense (onnx_ir cannot read them). ``all_weights``:
    weights left inside the model file are read into it."""
    deferred = load_model_deferred(model, check=False) if isinstance(model, (str, os.PathLike)) else model
    if isinstance(deferred, DeferredModel):
        if all_weights and deferred.inline:
            deferred.load()
        return dataclasses.replace(deferred, model=densify(deferred.model, str(deferred.files[0])))
    if not isinstance(deferred, onnx.ModelProto):
        raise TypeError(f"expected an onnx.ModelProto or a path, got {type(deferred).__name__}")
    return DeferredModel(densify(deferred), [Path("model")], {}, checked=False)
