"""Convert and explain: the pipeline behind ``amp-compiler convert --report`` and ``amp-compiler report``.

    samples (--calibration-data) -> ranges -> convert (or --tolerance refinement) -> node errors
    -> output accuracy (on the samples, or on random inputs) -> PrecisionReport

Every run of the model goes through one :class:`~amp_compiler.runtime.runner.Runner` (default: a child
process with the default :class:`~amp_compiler.runtime.runner.RunBudget`): a model that overruns it, or
crashes onnxruntime, stops the analysis with a user error. A model onnxruntime refuses (custom
ops, missing kernels) gets its report without accuracy, and a warning; unless the caller fixed
input shapes, which then are what the model does not run with.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx

from amp_compiler.core.decision import allow_message
from amp_compiler.errors import (
    ModelCrashError,
    ModelRefusedError,
    ModelRunError,
    ModelUnsupportedError,
    OptionError,
    RunBudgetError,
)
from amp_compiler.onnx.convert import convert
from amp_compiler.onnx.measure.calibrate import collect_ranges
from amp_compiler.onnx.measure.checks import compare
from amp_compiler.onnx.measure.emulate import emulate
from amp_compiler.onnx.tolerance.refine import Refinement, measure, refine
from amp_compiler.onnx.write.result import ConversionResult
from amp_compiler.options import ConvertOptions
from amp_compiler.policy import PolicyTable
from amp_compiler.report.build import build_report
from amp_compiler.report.model import PrecisionReport
from amp_compiler.runtime.runner import Runner, default_runner
from amp_compiler.runtime.samples import load_samples, random_samples
from amp_compiler.targets import Target


@dataclasses.dataclass
class Analysis:
    result: ConversionResult
    report: PrecisionReport
    refinement: Refinement | None = None


def _accuracy(
    fp32: onnx.ModelProto, converted: onnx.ModelProto, target: Target, samples: list, runner: Runner
) -> list:
    reference = runner.load(fp32)
    mixed = runner.load(emulate(converted))  # exact FP16/BF16 storage, whatever the CPU kernels do
    refs: list[list[np.ndarray]] = []
    gots: list[list[np.ndarray]] = []
    for sample in samples:
        refs.append(reference.run(sample))
        gots.append(mixed.run(sample))
    reference.close()
    mixed.close()
    out = []
    for k, info in enumerate(fp32.graph.output):
        ref = [r[k] for r in refs]
        if not all(np.issubdtype(np.asarray(r).dtype, np.floating) for r in ref):
            continue
        got = [g[k] for g in gots]
        out.append(
            compare(info.name, np.concatenate([np.ravel(r) for r in ref]), np.concatenate([np.ravel(g) for g in got]))
        )
    return out


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
                         runner=runner if fp8 else None)
        if samples:
            node_errors, _, runs = measure(model, result.model, samples, options.target, runner=runner)
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
    try:
        eval_samples = samples or random_samples(model, shapes)
        accuracy = _accuracy(model, result.model, options.target, eval_samples, runner)
        if not samples:
            warnings.append("output accuracy measured on random inputs: pass --calibration-data for real ones")
    except (RunBudgetError, ModelCrashError):
        raise
    except ModelRunError as exc:  # the model does not run here (custom ops, missing kernels, or the shapes)
        if result.input_shapes and not samples and not isinstance(exc, (ModelRefusedError, ModelUnsupportedError)):
            given = " ".join(f"{k}:{'x'.join(map(str, v))}" for k, v in options.input_shapes)
            raise OptionError(
                f"{given}: the model does not run with these shapes ({exc})", option="input_shapes"
            ) from None
        accuracy = []
        warnings.append(f"output accuracy not measured: {exc}")
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
    )
    return Analysis(result, report, refinement)
