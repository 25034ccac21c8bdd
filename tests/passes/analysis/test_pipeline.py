"""The analysis pipeline: one pass list for every caller, and checks that catch a pass breaking its guarantees."""

from __future__ import annotations

import dataclasses
import re

import onnx
import onnx.parser
import onnx.shape_inference
import onnx_ir as ir
import pytest
from onnx_ir.passes import PostconditionError, PreconditionError

from amp_compiler.core.measures import TensorRange
from amp_compiler.core.plan import Role, Rule
from amp_compiler.errors import OptionError
from amp_compiler.onnx.graph.precision_graph import build_precision_graph
from amp_compiler.passes.analysis import (
    CalibrationRangePass,
    ClassifyPass,
    ConstantRangePass,
    KernelCoveragePass,
    MinCutPlacementPass,
    PaintPass,
)
from amp_compiler.passes.analysis.pipeline import (
    AnalysisSettings,
    analysis_passes,
    checks_enabled,
    plan_precisions,
    run_passes,
)
from amp_compiler.policy import default_table
from amp_compiler.targets import Provider, Target
from tests.support.onnx_builders import tensor, weights

# x -> Mul(x, 1e6) -> MatMul -> Relu -> Slice -> MatMul: a constant beyond FP16's range, a MatMul on each
# side of two PASS ops, and a Slice that makes the cheaper Cast the one after it.
MODEL = """
<ir_version: 9, opset_import: ["" : 18]>
g (float[64, 64] x) => (float[8, 8] y) <float big = {1e6}, int64[2] starts = {0, 0}, int64[2] ends = {8, 8}> {
    scaled = Mul(x, big)
    a = MatMul(scaled, w)
    r = Relu(a)
    s = Slice(r, starts, ends)
    y = MatMul(s, w2)
}
"""


def _graph(target: Target = Target.FP16):
    proto = onnx.parser.parse_model(MODEL)
    proto.graph.initializer.extend([tensor("w", weights((64, 64))), tensor("w2", weights((8, 8), seed=1))])
    model = ir.from_proto(onnx.shape_inference.infer_shapes(proto, strict_mode=True))
    return build_precision_graph(model, target, default_table())


def _names(passes) -> list[str]:
    return [type(p).__name__ for p in passes]


def test_the_test_suite_checks_every_pass():
    assert checks_enabled()  # tests/conftest.py: every conversion in the tests runs the checks


def test_one_pass_list_for_every_caller():
    onnx_default = AnalysisSettings(Target.FP16)
    assert _names(analysis_passes(onnx_default)) == [
        "ClassifyPass", "KernelCoveragePass", "SignalPathPass", "PhaseArgumentPass", "PositionBiasPass", "LoopAccumulatorPass", "QuantizedIslandPass", "ThresholdInputPass", "RoutingScorePass", "RawSmallProductPass", "RawOffsetProductPass", "ConstantRangePass",
        "RuntimeHazardPass", "PaintPass", "MinCutPlacementPass", "NormFusionPass", "FinalKernelPass",
    ]
    ranges = {"a": TensorRange(0.0, 1.0, 1.0, 0.0, 0.0, 10)}
    calibrated = dataclasses.replace(onnx_default, ranges=ranges, placement="paint")
    assert _names(analysis_passes(calibrated)) == [
        "ClassifyPass", "KernelCoveragePass", "SignalPathPass", "PhaseArgumentPass", "PositionBiasPass", "LoopAccumulatorPass", "QuantizedIslandPass", "ThresholdInputPass", "RoutingScorePass", "RawSmallProductPass", "RawOffsetProductPass", "ConstantRangePass",
        "CalibrationRangePass", "RuntimeHazardPass", "PaintPass", "NormFusionPass", "FinalKernelPass",
    ]
    fx = AnalysisSettings(Target.BF16, kernel_coverage=False, runtime_hazards=False)
    assert _names(analysis_passes(fx)) == [
        "ClassifyPass", "SignalPathPass", "PhaseArgumentPass", "PositionBiasPass", "LoopAccumulatorPass", "QuantizedIslandPass", "ThresholdInputPass", "RoutingScorePass", "RawSmallProductPass", "RawOffsetProductPass", "ConstantRangePass", "PaintPass",
        "MinCutPlacementPass",
    ]
    with pytest.raises(OptionError, match="greedy") as bad:
        analysis_passes(dataclasses.replace(onnx_default, placement="greedy"))
    assert bad.value.option == "placement"


def test_the_checked_pipeline_gives_the_unchecked_plan():
    graph = _graph()
    checked = plan_precisions(graph, AnalysisSettings(Target.FP16), check=True)
    plain = plan_precisions(graph, AnalysisSettings(Target.FP16), check=False)
    assert checked.decisions == plain.decisions and checked.cast_bytes_final == plain.cast_bytes_final
    by_op = {graph.vertices[v].describe(): d.rule for v, d in checked.decisions.items()}
    assert by_op["Mul node ''"] is Rule.CONSTANT_OVERFLOW


# -- each check catches the pass that breaks its guarantee ---------------------------------------------------


class _LazyClassify(ClassifyPass):
    """Gives every vertex ALLOW, fixed ones included."""

    def call(self, graph, plan):
        for v in graph.vertices:
            plan.set_role(v.id, Role.ALLOW, Rule.POLICY_LOW, "everything low")


class _SilentConstants(ConstantRangePass):
    """Pins nothing."""

    def call(self, graph, plan):
        pass


class _DenyingCoverage(KernelCoveragePass):
    """Pins with DENY, which spreads FP32 downstream."""

    def call(self, graph, plan):
        for v in graph.vertices:
            if plan.roles[v.id] is Role.ALLOW:
                plan.set_role(v.id, Role.DENY, Rule.PROVIDER_NO_KERNEL, "no kernel")


class _HalfPaint(PaintPass):
    """Leaves the last vertex undecided."""

    def call(self, graph, plan):
        super().call(graph, plan)
        del plan.decisions[graph.vertices[-1].id]


class _WrongBooks(MinCutPlacementPass):
    """Records fewer cast bytes than its Casts move."""

    def call(self, graph, plan):
        super().call(graph, plan)
        plan.cast_bytes_final -= 1


class _IgnoresRanges(CalibrationRangePass):
    def call(self, graph, plan):
        pass


def _run(*passes, graph=None):
    return run_passes(graph or _graph(), list(passes), check=True)


@pytest.mark.parametrize(
    "passes, error, message",
    [
        ((_LazyClassify(),), PostconditionError, "FIXED"),
        ((ClassifyPass(), _SilentConstants(Target.FP16)), PostconditionError, "constant beyond fp16"),
        ((ClassifyPass(), _DenyingCoverage(Provider.CUDA)), PostconditionError, "changed role"),
        ((ClassifyPass(), ConstantRangePass(Target.FP16), _HalfPaint()), PostconditionError, "decided"),
        ((ClassifyPass(), ConstantRangePass(Target.FP16), PaintPass(), _WrongBooks()), PostconditionError, "recorded"),
        ((PaintPass(),), PreconditionError, "no role"),
        ((ClassifyPass(), MinCutPlacementPass()), PreconditionError, "painting"),
        ((ClassifyPass(), ClassifyPass()), PreconditionError, "roles already"),
    ],
    ids=["classify", "constants", "coverage", "paint", "mincut", "paint-first", "mincut-first", "classify-twice"],
)
def test_checks_catch_a_pass_that_breaks_its_guarantee(passes, error, message):
    with pytest.raises(error, match=re.escape(message)):
        _run(*passes)


def test_calibration_check_reads_the_ranges():
    graph = _graph()
    name = next(v.slots[0].value.name for v in graph.vertices if v.node is not None and v.node.op_type == "Relu")
    ranges = {name: TensorRange(-1e6, 1e6, 1e6, 0.0, 0.0, 10)}
    with pytest.raises(PostconditionError, match="beyond the target's range"):
        _run(ClassifyPass(), _IgnoresRanges(ranges, Target.FP16), graph=graph)
    _run(ClassifyPass(), CalibrationRangePass(ranges, Target.FP16), graph=graph)  # the real pass keeps it


def test_calibration_check_reads_the_underflow_error():
    """A tensor whose flush moves it by its whole norm is pinned; one whose flush moves it by less than
    FP16's rounding (however many values flush) is not a breach."""
    graph = _graph()
    name = next(v.slots[0].value.name for v in graph.vertices if v.node is not None and v.node.op_type == "Relu")
    moved = {name: TensorRange(0.0, 1e-8, 1e-8, 1.0, 1.0, 10, underflow_error=1.0)}
    with pytest.raises(PostconditionError, match="FP16's underflow moves"):
        _run(ClassifyPass(), _IgnoresRanges(moved, Target.FP16), graph=graph)
    _run(ClassifyPass(), CalibrationRangePass(moved, Target.FP16), graph=graph)
    harmless = {name: TensorRange(0.0, 1.0, 1.0, 0.9, 0.9, 10, underflow_error=1e-6)}
    _run(ClassifyPass(), _IgnoresRanges(harmless, Target.FP16), graph=graph)


def test_unchecked_runs_skip_the_checks():
    """Users' conversions run without the checks: a broken pass goes through."""
    run_passes(_graph(), [_LazyClassify()], check=False)
