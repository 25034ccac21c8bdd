"""The analysis pipeline: which passes turn a precision graph into a plan, in which order, and checked how.

    classify -> tolerance choices -> kernel coverage -> signal paths -> phase arguments -> position biases
    -> loop accumulators
    -> quantized islands -> threshold inputs -> routing scores -> raw small products
             -> constant ranges
                (--tolerance)        (ONNX frontends)
             -> static ranges -> calibration ranges -> runtime hazards -> paint -> range scaling -> range fallback
                (input ranges)   (with ranges)         (ONNX frontends)        (scaled FP16)    (BF16)
             -> min-cut placement -> norm fusions -> final kernels
                (placement="mincut")   (ONNX frontends) (ONNX, GPU providers: each node's final types looked up)

Every frontend and caller gets its passes from :func:`analysis_passes` (the ONNX conversion, the FX
conversion, the ``--tolerance`` refinement through the ONNX conversion, and the tests), so the order
is written once. :func:`run_passes` runs them on a new plan; with ``check`` each pass's ``requires``
runs before it and its ``ensures`` after it (:mod:`amp_compiler.passes.analysis.base`), which turn the
guarantees the passes document into checks. The checks cost about as much as the passes, so they
are off for users and on where ``AMP_COMPILER_CHECK_PASSES=1`` is set (the test suite sets it).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Hashable, Mapping, Sequence

from amp_compiler.core.graph import PrecisionGraph
from amp_compiler.core.measures import TensorRange
from amp_compiler.core.plan import PrecisionPlan
from amp_compiler.errors import OptionError
from amp_compiler.passes.analysis import (
    AnalysisPass,
    CalibrationRangePass,
    ClassifyPass,
    ConstantRangePass,
    FinalKernelPass,
    KernelCoveragePass,
    LoopAccumulatorPass,
    MinCutPlacementPass,
    NormFusionPass,
    PaintPass,
    PhaseArgumentPass,
    PositionBiasPass,
    QuantizedIslandPass,
    RangeFallbackPass,
    RangeScalingPass,
    RawOffsetProductPass,
    RawSmallProductPass,
    RoutingScorePass,
    RuntimeHazardPass,
    SignalPathPass,
    StaticRangePass,
    ThresholdInputPass,
    TolerancePinPass,
)
from amp_compiler.targets import Provider, Target

__all__ = ["AnalysisSettings", "analysis_passes", "check_placement", "checks_enabled", "plan_precisions", "run_passes"]

CHECK_ENV = "AMP_COMPILER_CHECK_PASSES"
# "mincut": re-decide painting's free choices to move the fewest cast bytes; "paint": painting only.
PLACEMENTS = ("mincut", "paint")


def check_placement(placement: str) -> None:
    """Raise :class:`OptionError` unless ``placement`` is one of :data:`PLACEMENTS`."""
    if placement not in PLACEMENTS:
        raise OptionError(f"unknown placement {placement!r}: expected mincut or paint", option="placement")


@dataclasses.dataclass(frozen=True)
class AnalysisSettings:
    """What the analysis passes need beyond the graph.

    ``block_nodes``, ``allow_nodes``: compiled patterns (:func:`~amp_compiler.passes.compile_patterns`).
    ``pinned``/``kept``: ops the ``--tolerance`` refinement keeps FP32 / low precision, with why.
    ``ranges``: calibration ranges by tensor name. ``elements``: element counts by tensor name for
    the cast costs, where the model's dims are dynamic. ``ranges_generated``: ``ranges`` were observed
    on generated inputs (the range probe), not calibration data: the rules say so (``probe.*``).
    ``kernel_coverage``: whether ops without a
    low-precision kernel on the provider stay FP32, and each node's final types are looked up on a GPU
    provider (ONNX models: the lookup reads ONNX schemas).
    ``runtime_hazards``: whether op patterns onnxruntime crashes on once a Cast sits inside them get no
    Cast there (ONNX models). ``range_fallback``: the type of what only FP16's range keeps out of FP16
    (``"scaled"``: Tensor Core ops in FP16 on power-of-two scaled operands where ``ranges`` allow it,
    else as ``"bf16"``: BF16 where the provider has the kernel, ONNX models of an FP16 target; ``"fp32"``).
    ``reached``: per tensor, the magnitude some input within the graph inputs' known ranges (stated, or
    calibration's) provably makes it reach (static ranges pin what exceeds the target); ``stated_reached``:
    the same from the stated ranges alone, a guarantee range scaling must hold in every channel.
    """

    target: Target
    provider: Provider = Provider.CUDA
    block_ops: frozenset[str] = frozenset()
    block_nodes: tuple[re.Pattern, ...] = ()
    allow_ops: frozenset[str] = frozenset()
    allow_nodes: tuple[re.Pattern, ...] = ()
    pinned: Mapping[Hashable, str] = dataclasses.field(default_factory=dict)
    kept: Mapping[Hashable, str] = dataclasses.field(default_factory=dict)
    ranges: Mapping[str, TensorRange] | None = None
    ranges_generated: bool = False  # ``ranges`` come from the range probe's generated inputs
    ranges_seen: str = ""  # what ``ranges`` were seen on, as reasons say it (default: calibration data / probe)
    placement: str = "mincut"
    reached: Mapping[str, float] | None = None
    stated_reached: Mapping[str, float] | None = None
    elements: Mapping[str, int] | None = None
    kernel_coverage: bool = True
    runtime_hazards: bool = True
    range_fallback: str = "fp32"


def analysis_passes(settings: AnalysisSettings) -> list[AnalysisPass]:
    """The analysis passes for ``settings``, in the order they run."""
    check_placement(settings.placement)
    passes: list[AnalysisPass] = [
        ClassifyPass(settings.provider, settings.block_ops, settings.block_nodes, settings.allow_ops,
                     settings.allow_nodes)
    ]
    if settings.pinned or settings.kept:
        passes.append(TolerancePinPass(settings.pinned, settings.kept))
    if settings.kernel_coverage:
        passes.append(KernelCoveragePass(settings.provider))  # right after classification
    passes.append(SignalPathPass())
    passes.append(PhaseArgumentPass())
    passes.append(PositionBiasPass())
    passes.append(LoopAccumulatorPass())
    passes.append(QuantizedIslandPass(settings.provider))
    passes.append(ThresholdInputPass())
    passes.append(RoutingScorePass())
    passes.append(RawSmallProductPass())  # after the pins that say more (a tree's input, a router)
    passes.append(RawOffsetProductPass())  # a first product over offset raw features, at any K
    passes.append(ConstantRangePass(settings.target, ranges=settings.ranges))
    if settings.reached:
        passes.append(StaticRangePass(settings.reached, settings.target))
    if settings.ranges:
        passes.append(CalibrationRangePass(settings.ranges, settings.target, generated=settings.ranges_generated,
                                           seen=settings.ranges_seen))
    if settings.runtime_hazards:
        passes.append(RuntimeHazardPass(settings.provider))  # once every role is final
    passes.append(PaintPass())
    if settings.range_fallback in ("scaled", "bf16") and settings.target is Target.FP16:
        if settings.range_fallback == "scaled" and settings.ranges:
            passes.append(RangeScalingPass(settings.ranges, reached=settings.stated_reached or {}))
        passes.append(RangeFallbackPass(settings.provider))
    if settings.placement == "mincut":
        passes.append(MinCutPlacementPass(settings.elements))
    if settings.runtime_hazards:
        passes.append(NormFusionPass(settings.provider))  # on the final decisions
    if settings.kernel_coverage and settings.provider is not Provider.CPU:
        passes.append(FinalKernelPass(settings.provider, settings.range_fallback))  # last: the final types
    return passes


def checks_enabled() -> bool:
    """Whether :func:`run_passes` checks every pass by default (``AMP_COMPILER_CHECK_PASSES=1``)."""
    return os.environ.get(CHECK_ENV, "") not in ("", "0")


def run_passes(graph: PrecisionGraph, passes: Sequence[AnalysisPass], *, check: bool | None = None) -> PrecisionPlan:
    """Run ``passes`` in order on a new plan and return it. ``check`` (default:
    :func:`checks_enabled`): run each pass's ``requires`` before it and its ``ensures`` after it,
    which raise ``PreconditionError``/``PostconditionError`` (from ``onnx_ir.passes``)."""
    check = checks_enabled() if check is None else check
    plan = PrecisionPlan()
    for analysis in passes:
        if check:
            analysis.requires(graph, plan)
            before = plan.snapshot()
            analysis.call(graph, plan)
            analysis.ensures(graph, plan, before)
        else:
            analysis.call(graph, plan)
    return plan


def plan_precisions(graph: PrecisionGraph, settings: AnalysisSettings, *, check: bool | None = None) -> PrecisionPlan:
    """The plan for ``graph``: :func:`run_passes` over :func:`analysis_passes`."""
    return run_passes(graph, analysis_passes(settings), check=check)
