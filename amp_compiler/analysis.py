"""Convert and explain: the pipeline behind ``amp-compiler convert --report`` and ``amp-compiler report``.

    samples (--calibration-data) -> ranges -> convert (or --tolerance refinement) -> node errors
    -> output accuracy (on the samples, or on random inputs) -> PrecisionReport

Every run of the model goes through one :class:`~amp_compiler.runtime.runner.Runner` (default: a child
process with the default :class:`~amp_compiler.runtime.runner.RunBudget`). Runs the conversion
needs (calibration, ``--tolerance``) stop the analysis with a user error when the model overruns
the budget, crashes onnxruntime or is refused. The accuracy run only measures: whatever stops it
(the budget, a crash, onnxruntime refusing the model or its inputs) leaves the report written with
the accuracy not measured and the reason (``Summary.accuracy_not_measured``, and a warning). Two
cases are the options' fault, one line each: input shapes the caller fixed that the model does not
run with, and shapes whose random inputs would not fit in memory. Without data, the inputs are
random at dims the model runs with (:mod:`amp_compiler.onnx.measure.generated_inputs`: 1 first,
then typical sizes), and the report says which.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import onnx

from amp_compiler.core.decision import allow_message
from amp_compiler.core.plan import Rule
from amp_compiler.errors import (
    ModelCrashError,
    ModelRefusedError,
    ModelRunError,
    ModelUnsupportedError,
    OptionError,
    RunBudgetError,
)
from amp_compiler.onnx.convert import convert
from amp_compiler.onnx.load.fused_ops import split_fused_ops
from amp_compiler.onnx.measure.calibrate import collect_ranges
from amp_compiler.onnx.measure.generated_inputs import Generated, runnable_inputs
from amp_compiler.onnx.measure.output_error import output_accuracy
from amp_compiler.onnx.tolerance.refine import Refinement, measure, refine
from amp_compiler.onnx.write.result import ConversionResult
from amp_compiler.options import ConvertOptions
from amp_compiler.policy import PolicyTable
from amp_compiler.report.build import build_report
from amp_compiler.report.model import PrecisionReport
from amp_compiler.runtime.runner import Runner, default_runner
from amp_compiler.runtime.samples import MAX_SAMPLE_BYTES, SampleSizeError, load_samples, sample_bytes
from amp_compiler.sizes import format_bytes
from amp_compiler.targets import Target

__all__ = ["Analysis", "analyze"]


@dataclasses.dataclass
class Analysis:
    """What :func:`analyze` made: the conversion, its precision report, and the ``--tolerance``
    refinement when one ran."""

    result: ConversionResult
    report: PrecisionReport
    refinement: Refinement | None = None


def analyze(
    model: onnx.ModelProto,
    options: ConvertOptions,
    *,
    model_name: str = "model",
    calibration_data: str | Path | None = None,
    tolerance: float | None = None,
    input_shapes: dict[str, tuple[int, ...]] | None = None,
    policy: PolicyTable | None = None,
    runner: Runner | None = None,
) -> Analysis:
    """Convert ``model`` and build its precision report (see module doc). ``input_shapes``: graph
    input shapes (default: ``options.input_shapes``), checked once, by the conversion. ``runner``:
    where the model runs (default: a child process with the default budget)."""
    if tolerance is not None and calibration_data is None:
        raise OptionError("needs calibration data (the samples it measures error on)", option="tolerance")
    if tolerance is not None and not tolerance > 0:
        raise OptionError(f"must be positive, got {tolerance}", option="tolerance")
    if input_shapes is not None:
        options = dataclasses.replace(options, input_shapes=tuple((k, tuple(v)) for k, v in input_shapes.items()))
    runner, owned = default_runner(runner)
    try:
        return _analyze(model, options, model_name, calibration_data, tolerance, policy, runner)
    finally:
        if owned:
            runner.close()


def _analyze(
    model: onnx.ModelProto, options: ConvertOptions, model_name: str, calibration_data: str | Path | None,
    tolerance: float | None, policy: PolicyTable | None, runner: Runner,
) -> Analysis:
    # as the conversion splits them: node positions refer to the split model
    fused = split_fused_ops(model, kept=options.block_ops)
    model = fused.model
    samples = load_samples(calibration_data, model) if calibration_data is not None else []
    ranges = collect_ranges(model, samples, runner=runner) if samples else None
    refinement = None
    node_errors = None
    runs = 0
    if tolerance is not None:
        refinement = refine(model, samples, tolerance, options, ranges=ranges, policy=policy, runner=runner)
        result, node_errors, runs = refinement.result, refinement.node_errors, refinement.model_runs
        model = refinement.fp32 or model  # at the FP8 opset, for --target fp8: the positions refer to it
    else:
        fp8 = options.target is Target.FP8  # the per-layer FP8 choice runs the samples
        result = convert(model, options, policy=policy, ranges=ranges, samples=samples if fp8 else None,
                         runner=runner)  # the FP8 choice's runs, or the range probe's
        if samples:
            node_errors, _, runs = measure(model, result.model, samples, options.target, runner=runner)
    result.fused_split = result.fused_split or fused.note
    shapes = result.input_shapes or ({k: v.shape for k, v in samples[0].items()} if samples else None)
    warnings: list[str] = []
    allowed = allow_message(result.decisions, result.allowed, options.low_target.value)
    if allowed:
        warnings.append(allowed)
    if result.warnings:
        warnings.append(
            "overflows that depend on an input's scale (--input-range NAME:LO,HI keeps them FP32): "
            + "; ".join(result.warnings)
        )
    if result.probe_skipped:
        warnings.append(f"converted without the range probe: {result.probe_skipped}")
    if result.reference != "fp32":  # a converted model given again: its errors here are against itself
        warnings.append(f"output errors are measured against {result.reference}: `amp-compiler compare FP32.onnx "
                        f"{model_name}` measures it against its FP32 source")
    generated: Generated | None = None
    if result.probe_inputs:  # the range probe measured the written model on its generated inputs
        accuracy, not_measured = result.accuracy, result.accuracy_not_measured
        warnings.append(_probe_warning(result))
    else:
        accuracy, not_measured, generated = _measure_accuracy(model, result, samples, options, runner)
    if not_measured:
        warnings.append(f"output accuracy not measured: {not_measured}")
    elif result.probe_inputs:
        warnings.append("output accuracy measured on the range probe's generated inputs: pass --calibration-data "
                        "for real ones")
    elif not samples:
        used = f" (dynamic dims: {generated.describe()})" if generated is not None and generated.dims else ""
        warnings.append(f"output accuracy measured on random inputs{used}: pass --calibration-data for real ones")
    if generated is not None and generated.refused:  # costs at the sizes the model runs with, not 1
        shapes = {k: v.shape for k, v in generated.samples[0].items()}
    elif result.probe_inputs and not shapes:
        shapes = dict(result.probe_shapes)
    report = build_report(
        model,
        result,
        model_name=model_name,
        input_shapes=shapes,
        ranges=ranges,
        node_errors=node_errors,
        accuracy=accuracy,
        samples=len(samples),
        model_runs=runs,
        pinned=len(refinement.pinned) if refinement else 0,
        tolerance=tolerance,
        warnings=warnings,
        policy=policy,
        accuracy_not_measured=not_measured,
        generated_dims=generated.dims if generated is not None else (result.probe_dims or None),
        accuracy_on=dict(result.accuracy_on) if result.probe_inputs else None,
    )
    return Analysis(result, report, refinement)


def _probe_warning(result: ConversionResult) -> str:
    """The report's word on the range probe: where ranges came from, and the nodes they kept FP32."""
    moved = [d for d in result.decisions if d.rule in (Rule.PROBE_OVERFLOW.value, Rule.PROBE_UNDERFLOW.value)]
    names = ", ".join(f"{d.node} ({d.rule})" for d in moved[:8])
    names += f", and {len(moved) - 8} more" if len(moved) > 8 else ""
    return (f"ranges from generated inputs ({result.probe_inputs}), not calibration data: "
            + (f"{len(moved)} node(s) kept FP32 by them: {names}" if moved else "no node kept FP32 by them"))


def _measure_accuracy(
    model: onnx.ModelProto, result: ConversionResult, samples: list, options: ConvertOptions, runner: Runner,
) -> tuple[list, str, Generated | None]:
    """(each float output's accuracy, why it was not measured ("" when it was), how random inputs
    were made (None: the samples were given)). See the module doc for what is an error instead."""
    given = result.input_shapes
    if given and not samples and sample_bytes(model, given) > MAX_SAMPLE_BYTES:
        raise OptionError(
            f"{_shapes_text(options)}: random inputs of these shapes take {format_bytes(sample_bytes(model, given))}, "
            f"more than the {format_bytes(MAX_SAMPLE_BYTES)} generated or calibration inputs may take",
            option="input_shapes",
        )
    generated = None
    try:
        if samples:
            return output_accuracy(model, result.model, samples, runner), "", None
        generated = runnable_inputs(model, runner, given)
        return output_accuracy(model, result.model, generated.samples, runner, generated.outputs), "", generated
    except ModelRunError as exc:
        shapes_fault = not isinstance(exc, (ModelRefusedError, ModelUnsupportedError, RunBudgetError, ModelCrashError))
        if given and not samples and shapes_fault and generated is None:
            raise OptionError(
                f"{_shapes_text(options)}: the model does not run with these shapes ({exc})", option="input_shapes"
            ) from None
        return [], str(exc), generated
    except SampleSizeError as exc:  # the model's own dims
        return [], str(exc), None


def _shapes_text(options: ConvertOptions) -> str:
    return " ".join(f"{k}:{'x'.join(map(str, v))}" for k, v in options.input_shapes)
