"""``amp-compiler convert``: convert a model file and print a one-line summary.

    model file -> (output path checked) -> load, large weights left on disk -> convert
                  (or, with --report/--calibration-data/--tolerance, analyze) -> save (the output
                  loaded in onnxruntime's child process before it is renamed into place) -> summary
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import sys
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from amp_compiler import runtime
from amp_compiler.cli.args.analysis import AnalysisArgs
from amp_compiler.cli.args.conversion import ConversionArgs
from amp_compiler.cli.args.model_file import ModelFileArgs
from amp_compiler.cli.args.report import ReportFileArgs
from amp_compiler.cli.args.run import RunArgs
from amp_compiler.cli.command import Command
from amp_compiler.sizes import format_bytes

if TYPE_CHECKING:  # the conversion's modules are imported when it runs, not to build the parser
    from amp_compiler.analysis import Analysis
    from amp_compiler.core.measures import OutputAccuracy
    from amp_compiler.onnx.write.result import ConversionResult

__all__ = ["ConvertCommand"]


class ConvertCommand(Command):
    """Convert; the analysis path (every weight in memory, onnxruntime runs) only when a report,
    calibration data or a tolerance asks for it."""

    name = "convert"
    help = "convert an FP32 ONNX model to mixed precision"

    def __init__(self) -> None:
        self.files = ModelFileArgs(output=True)
        self.conversion = ConversionArgs()
        self.analysis = AnalysisArgs(self.conversion)
        self.report = ReportFileArgs()
        self.running = RunArgs(load_check=True)
        self.groups = [self.files, self.conversion, self.analysis, self.report, self.running]

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("-q", "--quiet", action="store_true", help="print nothing on success")

    def run(self, args: argparse.Namespace) -> int:
        from amp_compiler.core.decision import unconverted_message
        from amp_compiler.core.tensor_error import metric_name
        from amp_compiler.onnx.convert import convert
        from amp_compiler.onnx.write.load_check import OutputLoadCheck

        files = self.files.open()  # the output path is checked before the work, not after it
        start = time.perf_counter()
        explain = self.analysis.asked or self.report.path is not None
        warnings: list[str] = []
        load_checked = self.running.load_check and runtime.is_installed()
        if self.running.load_check and not load_checked:
            warnings.append(
                f"the converted model was not checked: onnxruntime is not installed (nor its ranges probed); "
                f"{runtime.INSTALL_HINT}"
            )
        # onnxruntime's child process starts now: importing it overlaps the conversion.
        runner = self.running.runner() if explain or load_checked else None
        with contextlib.ExitStack() as stack:
            if runner is not None:
                stack.enter_context(runner)
            # Large external-data weights stay on disk (validated), read one at a time by the conversion.
            # A plain conversion checks the model itself, while it builds the IR (in parallel for large ones).
            loaded = files.load_deferred(check=explain)
            analysis = (
                self.analysis.run(loaded.load(), model_name=files.source.name, runner=runner)
                if explain and runner else None
            )
            options = self.conversion.options
            if options.probe and not runtime.is_installed():  # said in the load check's warning
                options = dataclasses.replace(options, probe=False)
            result = analysis.result if analysis else convert(loaded, options, runner=runner)
            if analysis:
                self.report.write(analysis.report, files.source)

            if runner is not None and not runner.alive:  # the accuracy run went over the budget or crashed it
                runner = self.running.runner()
                stack.enter_context(runner)
            check = OutputLoadCheck(files.source, self.running.budget, runner) if load_checked and runner else None
            if check is not None:
                check.start(result)  # the pieces of an in-memory output load while it is written
            output_files = files.save(result, check)
            unconverted = unconverted_message(result.decisions, result.options.low_target.value)
            warnings.extend([unconverted] if unconverted else [])
            warnings.extend(result.provider_warnings)
            warnings.extend(check.warnings if check is not None else ())
        accuracy, measured_on, kinds = _measured(result, analysis)
        warnings.extend(accuracy_warnings(
            accuracy, measured_on, files.source, output_files[0], kinds, data=self.analysis.calibration_data,
            tolerance=self.analysis.tolerance, metric=metric_name(self.conversion.options.metric)))
        if analysis is None and result.accuracy_not_measured:
            warnings.append(f"output accuracy not measured: {result.accuracy_not_measured}")
        if result.probe_skipped:
            warnings.append(f"converted without the range probe: {result.probe_skipped}")
        if not args.quiet:
            line = summary_line(result, files.files, output_files, time.perf_counter() - start)
            line += load_check_note(check.disabled) if check is not None else ""
            print(line + accuracy_note(accuracy, measured_on, kinds, result.reference))
            if analysis and analysis.refinement:
                print(tolerance_line(analysis, self.analysis.tolerance))
                if analysis.refinement.why_fp32:
                    warnings.append(analysis.refinement.why_fp32)
            for warning in warnings:
                print(f"amp-compiler: warning: {warning}", file=sys.stderr)
        return 0


def summary_line(result: ConversionResult, input_files: list[Path], output_files: list[Path], seconds: float) -> str:
    """One line: where the model went, its nodes by precision, Tensor Core ops (float ones in the target, and
    apart from them the int8 DequantizeLinear -> product units the provider fuses), Casts (inserted, and the
    input's that became unnecessary), the size (model file plus external data files, before and after),
    a warning counting the nodes left as they are for want of an element type, what ``--allow-op``/
    ``--allow-node`` forced, and the first overflow that depends on an input's scale, if any."""
    from amp_compiler.core.decision import allow_message
    from amp_compiler.core.plan import INSERTED_RULES, RANGE_ONLY_RULES, Rule
    from amp_compiler.onnx.fp8.steps import fp8_flop_share
    from amp_compiler.policy import default_table
    from amp_compiler.targets import Target

    dst = output_files[0]
    decisions = result.decisions
    target = result.options.target.value
    policy = default_table()
    # float64 products stay double (the conversion leaves them as they are): no candidates
    heavy = [d for d in decisions if policy.is_tensor_core(d.domain, d.op_type) and d.precision != "fp64"]
    # int8 DQ -> product units the provider fuses (quantized.product): no float product, counted apart
    int8 = sum(1 for d in heavy if d.rule == Rule.QUANTIZED_PRODUCT.value)
    heavy_low = sum(1 for d in heavy if d.precision == target)
    # FP16 conversions: Tensor Core ops in BF16 (the range fallback) are on Tensor Cores too
    heavy_bf16 = sum(1 for d in heavy if d.precision == Target.BF16.value) if target == Target.FP16.value else 0
    # ... and those run in FP16 on power-of-two scaled operands: low, yet decided by a range rule
    range_rules = {r.value for r in RANGE_ONLY_RULES}
    heavy_scaled = sum(1 for d in heavy if d.precision == target and d.rule in range_rules)
    inserted = {rule.value for rule in INSERTED_RULES}  # nodes the conversion added
    by_precision = Counter(d.precision for d in decisions if d.rule not in inserted)
    size_in = sum(Path(f).stat().st_size for f in input_files)
    size_out = sum(Path(f).stat().st_size for f in output_files)
    allowed = allow_message(decisions, result.allowed, result.options.low_target.value)
    return (
        f"{dst}: {target} model written in {seconds:.2f} s | nodes: "
        + ", ".join(f"{k} {v}" for k, v in sorted(by_precision.items()))
        + f" | Tensor Core ops in {target}: {heavy_low}/{len(heavy) - int8}"
        + (f", int8 (QDQ, run by the provider): {int8}" if int8 else "")
        + (f" (range-scaled: {heavy_scaled})" if heavy_scaled else "")
        + (f" (bf16 range fallback: {heavy_bf16})" if heavy_bf16 else "")
        + (f" ({fp8_flop_share(result):.0%} of their FLOPs)" if target == Target.FP8.value else "")
        + (f" | {result.opset_change}" if result.opset_change else "")
        + (f" | {result.node_order}" if result.node_order else "")
        + (f" | {result.fused_split}" if result.fused_split else "")
        + f" | casts inserted: {result.casts_inserted}"
        + (f" (the model's own removed: {result.casts_removed})" if result.casts_removed else "")
        + f" | size {format_bytes(size_in)} -> {format_bytes(size_out)}"
        + (
            f" | WARNING: {len(result.untyped_nodes)} node(s) of unknown element type left as they are"
            " (--strict refuses them)" if result.untyped_nodes else ""
        )
        + (f" | warning: {allowed}" if allowed else "")
        + overflow_note(result.warnings)
        + probe_note(result)
    )


def load_check_note(disabled: tuple[str, ...]) -> str:
    """The summary line's end when the load check turned optimizers off (see
    :mod:`amp_compiler.onnx.write.load_check`), else nothing."""
    if not disabled:
        return ""
    return (
        f" | load check on onnxruntime's CPU provider without {', '.join(disabled)}: it trips only on the Cast "
        "that provider alone inserts around an FP16 MatMul"
    )


def probe_note(result: ConversionResult) -> str:
    """The summary line's word on the range probe: that ranges came from generated inputs, and how
    many nodes they kept out of plain FP16, by the precision they took (FP16 on scaled operands: "fp16
    scaled")."""
    from amp_compiler.core.plan import Rule

    if not result.probe_inputs:
        return ""
    rules = (Rule.PROBE_OVERFLOW.value, Rule.PROBE_UNDERFLOW.value)
    low = result.options.low_target.value
    taken = Counter(f"{d.precision} scaled" if d.precision == low else d.precision
                    for d in result.decisions if d.rule in rules)
    split = f" ({', '.join(f'{p} {n}' for p, n in sorted(taken.items()))})" if taken else ""
    return (f" | ranges from generated inputs ({result.probe_inputs}): {sum(taken.values())} node(s) kept out of "
            f"plain {low} by them{split}, {result.probe_runs} model run(s)")


def _measured(
    result: ConversionResult, analysis: Analysis | None
) -> tuple[list[OutputAccuracy], str, dict[str, str]]:
    """The written model's output errors, what they were measured on, and per output the kind of
    generated input that showed its error (the range probe's, on a model with an image input): the
    report's (calibration data, or the probe's or random inputs), else the conversion's own (the range
    probe's inputs)."""
    if analysis is not None:
        s = analysis.report.summary
        if s.calibration_samples:
            return list(s.accuracy), "the calibration data", {}
        return list(s.accuracy), "generated inputs", dict(s.accuracy_on)
    return list(result.accuracy), "generated inputs", dict(result.accuracy_on)


def accuracy_note(
    accuracy: list[OutputAccuracy], measured_on: str, kinds: Mapping[str, str] | None = None, reference: str = "fp32",
) -> str:
    """The summary line's output error against FP32 (exact emulation): per output when there are
    several, at most three, worst first (max error as a share of the output's range, rel-L2, cosine; an
    integer/bool output's changed values, always stated, 0 included), each with the kind of input that
    showed it when ``kinds`` names one; ``reference``: what it is measured against (the conversion's
    ``reference``: fp32, or an input that stores FP16 already)."""
    from amp_compiler.onnx.measure.output_error import severity

    if not accuracy:
        return ""
    worst = sorted(accuracy, key=severity)
    shown = worst if len(worst) <= 3 else worst[:3]
    parts = [_one_error(a, name=len(accuracy) > 1) + _shown_on(a, kinds) + _tie_note(a) for a in shown]
    more = f" (+{len(accuracy) - 3} more)" if len(accuracy) > 3 else ""
    return f" | output error vs {reference} on {measured_on}: " + "; ".join(parts) + more


def _shown_on(a: OutputAccuracy, kinds: Mapping[str, str] | None) -> str:
    """The kind of generated input that showed ``a``'s error, as ' (dead-leaves image)', where ``kinds``
    names one; else nothing."""
    return f" ({kinds[a.name]})" if kinds and a.name in kinds else ""


def _one_error(a: OutputAccuracy, *, name: bool) -> str:
    from amp_compiler.onnx.load.text import shown
    from amp_compiler.report.common import changed_text

    who = f"{shown(a.name)} " if name else ""
    if a.empty:
        return f"{who}not measured (empty in FP32)"
    if a.changed is not None:
        return f"{who}{changed_text(a.changed, a.values)} changed"
    if not a.finite:
        return f"{who}NaN/Inf where FP32 is finite"
    if not a.measured:
        return f"{who}not measured (FP32's own values are NaN/Inf)"
    rel = f", rel-L2 {a.rel_l2:.2g}" if a.rel_l2 is not None else ""
    return f"{who}max {a.error_of_range:.2%} of range{rel}, cosine {a.cosine:.6f}"


def _tie_note(a: OutputAccuracy) -> str:
    """', up to X% at a tie' where a tie between two classes would move the output past the line
    (:func:`~amp_compiler.onnx.measure.output_error.moves_at_ties`); else nothing."""
    from amp_compiler.onnx.measure.output_error import moves_at_ties

    return f", up to {a.tie_move:.1%} at a tie" if moves_at_ties(a) else ""


def accuracy_warnings(
    accuracy: list[OutputAccuracy], measured_on: str, model: Path, output: Path,
    kinds: Mapping[str, str] | None = None, *, data: str | None = None, tolerance: float | None = None,
    metric: str = "rel-l2",
) -> list[str]:
    """One warning when an output misses the line (:func:`~amp_compiler.onnx.measure.output_error.misses`):
    the worst such output, how far, on what (``kinds``: the kind of input that showed it, per output),
    and the commands that help, given what the user already passed (``data``: ``--calibration-data``;
    ``tolerance`` and its ``metric``): never the options they just used. Then one naming the outputs
    whose error could not be measured (:func:`_unmeasured_warning`)."""
    from amp_compiler.onnx.load.text import quote
    from amp_compiler.onnx.measure.output_error import MAX_CHANGED_SHARE, MAX_ERROR_OF_RANGE, misses, severity
    from amp_compiler.report.common import changed_text

    unmeasured = _unmeasured_warning(accuracy, measured_on, data) + _concentrated_warning(
        accuracy, measured_on, model, output, data, tolerance, metric, kinds) + _tie_warning(
        accuracy, measured_on, model, output, data, tolerance, metric) + _saturated_warning(
        accuracy, measured_on, model, output, data)
    first = _first_of(sorted((a for a in accuracy if misses(a)), key=severity))
    if first is None:
        return unmeasured
    a, more = first
    if a.changed is not None:
        how = f"changes {changed_text(a.changed, a.values)}"
        line = f"past {MAX_CHANGED_SHARE:.0%} of its values changed"
    else:
        how = "holds NaN/Inf where FP32 does not" if not a.finite else (
            f"is off by {a.error_of_range:.2%} of its range (cosine {a.cosine:.6f})")
        line = f"past {MAX_ERROR_OF_RANGE:.0%} of range or cosine 0.999"
    return [f"output {quote(a.name)} {how} on {measured_on}{_shown_on(a, kinds)}{more}, {line}: "
            + _advice(model, output, data, tolerance, metric), *unmeasured]


def _first_of(found: list[OutputAccuracy]) -> tuple[OutputAccuracy, str] | None:
    """The first of ``found`` (the one a warning names) and ' (and N more output(s))' for the others; None
    where ``found`` is empty."""
    if not found:
        return None
    return found[0], f" (and {len(found) - 1} more output(s))" if len(found) > 1 else ""


def _concentrated_warning(
    accuracy: list[OutputAccuracy], measured_on: str, model: Path, output: Path, data: str | None,
    tolerance: float | None, metric: str, kinds: Mapping[str, str] | None = None,
) -> list[str]:
    """One warning for the outputs within the line whose error sits in a few positions far beyond the rest
    (:func:`~amp_compiler.onnx.measure.output_error.concentrated`): the measured max is then no bound for
    other inputs (longer sequences, other tokens), which reach the condition that amplifies rounding more
    often or more closely."""
    from amp_compiler.onnx.load.text import quote
    from amp_compiler.onnx.measure.output_error import concentrated

    first = _first_of(sorted((a for a in accuracy if concentrated(a)),
                             key=lambda a: -a.error_of_range * (a.concentration or 0)))
    if first is None:
        return []
    a, more = first
    on = f"{measured_on}{_shown_on(a, kinds)}"  # the input kind that showed it: maybe a normalization never seen
    return [f"output {quote(a.name)} is off by {a.error_of_range:.2%} of its range on {on}{more}, but "
            f"its worst position is {a.concentration:.0f}x the 90th percentile's: a few inputs' values amplify "
            "FP16 rounding there, so longer or other inputs can miss further (past 2% of range): "
            + _advice(model, output, data, tolerance, metric)]


def _tie_warning(
    accuracy: list[OutputAccuracy], measured_on: str, model: Path, output: Path, data: str | None,
    tolerance: float | None, metric: str,
) -> list[str]:
    """One warning for the probability outputs within the line that a tie between two classes would move past
    it (:func:`~amp_compiler.onnx.measure.output_error.moves_at_ties`): the inputs measured seldom tie, real
    ones (text between characters, look-alike classes) do."""
    from amp_compiler.onnx.load.text import quote
    from amp_compiler.onnx.measure.output_error import moves_at_ties

    first = _first_of(sorted((a for a in accuracy if moves_at_ties(a)), key=lambda a: -(a.tie_move or 0.0)))
    if first is None:
        return []
    a, more = first
    return [f"output {quote(a.name)} is off by {a.error_of_range:.2%} of its range on {measured_on}{more}, but "
            f"the conversion moves its logits' differences enough that where two classes tie it moves by up to "
            f"{a.tie_move:.1%} of its range (past 2%): inputs that tie miss further: "
            + _advice(model, output, data, tolerance, metric)]


def _saturated_warning(
    accuracy: list[OutputAccuracy], measured_on: str, model: Path, output: Path, data: str | None,
) -> list[str]:
    """One warning for the probability outputs within the line that generated inputs left certain
    everywhere (:func:`~amp_compiler.onnx.measure.output_error.saturated`). Calibration data is real:
    nothing is said of it."""
    from amp_compiler.onnx.load.text import quote
    from amp_compiler.onnx.measure.output_error import moves_at_ties, saturated

    first = _first_of([a for a in accuracy if saturated(a) and not moves_at_ties(a)])  # that warning says more
    if data is not None or first is None:
        return []
    a, more = first
    return [f"output {quote(a.name)}{more}: on {measured_on} its top probability is 1 in low precision at "
            f"{a.saturated:.0%} of its positions (certain everywhere), so its stated error says nothing of the "
            f"near-ties real inputs reach: check it on real inputs with `amp-compiler compare {model} {output} "
            "--data DIR`"]


def _unmeasured_warning(accuracy: list[OutputAccuracy], measured_on: str, data: str | None) -> list[str]:
    """One warning naming the outputs whose FP32 values were all NaN/Inf on ``measured_on`` (their error is
    unknown: a Log of the probe's negative noise), one naming those that were empty there (a difference
    along a dim of 1), each with what gives inputs they compute on."""
    from amp_compiler.onnx.load.text import quote

    out = []
    for empty in (False, True):
        unmeasured = [a.name for a in accuracy if a.finite and not a.measured and a.empty == empty]
        if not unmeasured:
            continue
        names = ", ".join(quote(n) for n in unmeasured[:3]) + (f" (and {len(unmeasured) - 3} more)"
                                                              if len(unmeasured) > 3 else "")
        its = "their" if len(unmeasured) > 1 else "its"
        if empty:
            helps = ("give --input-shape NAME:DIMS at sizes it has values at, or --calibration-data DIR"
                     if data is None else "check the data's shapes")
            what = f"FP32's output{'s are' if len(unmeasured) > 1 else ' is'} empty (no values)"
        else:
            helps = ("give --input-range NAME:LO,HI for the inputs, or --calibration-data DIR" if data is None
                     else "check the data's values")
            what = "FP32's own values are all NaN/Inf"
        out.append(f"output{'s' if len(unmeasured) > 1 else ''} {names}: {what} on {measured_on}, so {its} "
                   f"error is not measured; {helps}")
    return out


def _advice(model: Path, output: Path, data: str | None, tolerance: float | None, metric: str) -> str:
    """What helps an output that misses the line, past what was given: real inputs to check it on, then
    ``--tolerance`` on them, then a tolerance held to the output's own max error (``--metric max-range``:
    a relative L2 tolerance can be met while a few values move far)."""
    if data is None:
        return (f"check it on real inputs with `amp-compiler compare {model} {output} --data DIR`, and convert with "
                "`--calibration-data DIR --tolerance 0.01` to keep what it takes in FP32")
    if tolerance is None:
        return "convert with `--tolerance 0.01` on that data to keep what it takes in FP32"
    if metric != "max-range":
        return (f"--tolerance {tolerance:g} holds each output's {metric}, not its largest error: add "
                "`--metric max-range` to hold that")
    return f"a --tolerance below {tolerance:g} keeps more of it in FP32"


def overflow_note(warnings: list[str]) -> str:
    """The summary line's end when some tensor overflows above an input magnitude: the first such
    node, how many more, and the option that keeps them FP32."""
    if not warnings:
        return ""
    more = f" (and {len(warnings) - 1} more)" if len(warnings) > 1 else ""
    return f" | warning: {warnings[0]}{more}: --input-range NAME:LO,HI keeps what overflows FP32"


def tolerance_line(analysis: Analysis, tolerance: float | None) -> str:
    """Whether ``--tolerance`` was met, the worst output error, and what it took."""
    r = analysis.refinement
    assert r is not None
    worst = max(r.output_errors.values(), default=0.0)
    low = analysis.result.options.low_target.value
    fp8 = f" ({_share(r.fp8_flops_share)} in fp8)" if analysis.result.options.target.value == "fp8" else ""
    kept = (f", {_share(r.low_flops_share)} of their Tensor Core FLOPs kept {low} or lower{fp8} (at most "
            f"{_share(r.ceiling)} could be)" if r.units else "")
    what = "relative L2" if r.metric == "rel-l2" else r.metric
    held = (f", {max(r.held_out_errors.values(), default=0.0):.3g} on {r.held_out} held-out sample(s)"
            if r.held_out else "")
    return (
        f"--tolerance {tolerance:g}: {'met' if r.met else 'NOT met'} (worst output "
        f"{what} {worst:.3g}{held}) after {r.rounds} conversions, {r.model_runs} model runs; "
        f"{len(r.pinned)} node(s) pinned to FP32{kept}"
    )


def _share(x: float) -> str:
    """A share rounded down to 0.1% (99.99% is not 100%)."""
    return f"{math.floor(x * 1000) / 10:.1f}%"
