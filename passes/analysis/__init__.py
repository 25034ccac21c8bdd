"""Analysis passes: a :class:`~amp_compiler.core.graph.PrecisionGraph` in, a
:class:`~amp_compiler.core.plan.PrecisionPlan` out, the model never edited.

In pipeline order (:func:`~amp_compiler.passes.analysis.pipeline.analysis_passes`): ``ClassifyPass``
(policy roles), ``TolerancePinPass`` (``--tolerance``'s choice: the nodes it pinned stay FP32 without
spreading, those it kept stay low), ``KernelCoveragePass`` (ops without a low-precision kernel on the
target provider stay FP32), ``SignalPathPass`` (the linear path from a raw input into a Log stays
FP32), ``PhaseArgumentPass`` (the linear path from raw positions or coordinates into a Sin/Cos stays
FP32), ``PositionBiasPass`` (the linear path from positions into a Softmax's logits stays FP32),
``LoopAccumulatorPass`` (a Loop/Scan state its body adds into itself stays FP32), ``QuantizedIslandPass``
(values quantized again and quantization scales stay FP32),
``ThresholdInputPass`` (what a tree ensemble or another threshold-reading op reads is computed in FP32),
``RoutingScorePass`` (the scores a TopK/ArgMax whose indices route computation reads, a router, in FP32),
``RawSmallProductPass`` (a Tensor Core op with K < 16 reading raw coordinates or features stays FP32),
``RawOffsetProductPass`` (a first product whose folded bias says it reads raw features centred far from zero,
which the target would round past what the model resolves, stays FP32),
``ConstantRangePass`` (unrepresentable constants), ``StaticRangePass`` (what provably overflows for
the inputs' known ranges), ``CalibrationRangePass`` (observed ranges), ``RuntimeHazardPass`` (no Cast
inside op patterns onnxruntime crashes on: FP32 where the provider inserts one, else the Transpose
takes its MatMul's precision), ``PaintPass`` (propagation), ``RangeScalingPass`` (FP16 on power-of-two
scaled operands for the Tensor Core ops only FP16's range keeps out: ``--range-fallback scaled``),
``RangeFallbackPass`` (BF16, not FP32,
for what only FP16's range keeps out of FP16: ``--range-fallback bf16``),
``MinCutPlacementPass`` (cast bytes minimised exactly over painting's free choices), ``NormFusionPass``
(a hand-written LayerNorm's scale takes the type onnxruntime's norm fusion reads as its input),
``FinalKernelPass`` (each node's final types looked up in the GPU provider's kernel table: a Cast-bytes
or BF16-allowing FP32 choice moves where FP32 has no kernel, the rest is recorded for a warning).
"""

from amp_compiler.passes.analysis.accumulators import LoopAccumulatorPass
from amp_compiler.passes.analysis.base import AnalysisPass
from amp_compiler.passes.analysis.calibration import CalibrationRangePass
from amp_compiler.passes.analysis.classify import ClassifyPass, UserChoices, compile_patterns
from amp_compiler.passes.analysis.constants import ConstantRangePass
from amp_compiler.passes.analysis.coverage import KernelCoveragePass
from amp_compiler.passes.analysis.final_kernels import FinalKernelPass
from amp_compiler.passes.analysis.hazards import RuntimeHazardPass
from amp_compiler.passes.analysis.mincut import MinCutPlacementPass
from amp_compiler.passes.analysis.norm_fusion import NormFusionPass
from amp_compiler.passes.analysis.paint import PaintPass
from amp_compiler.passes.analysis.phase import PhaseArgumentPass
from amp_compiler.passes.analysis.pins import TolerancePinPass
from amp_compiler.passes.analysis.position_bias import PositionBiasPass
from amp_compiler.passes.analysis.quantized import QuantizedIslandPass
from amp_compiler.passes.analysis.range_fallback import RangeFallbackPass
from amp_compiler.passes.analysis.range_scaling import RangeScalingPass
from amp_compiler.passes.analysis.raw_offsets import RawOffsetProductPass
from amp_compiler.passes.analysis.raw_products import RawSmallProductPass
from amp_compiler.passes.analysis.routing import RoutingScorePass
from amp_compiler.passes.analysis.signal import SignalPathPass
from amp_compiler.passes.analysis.static_ranges import StaticRangePass
from amp_compiler.passes.analysis.thresholds import ThresholdInputPass

__all__ = [
    "AnalysisPass",
    "CalibrationRangePass",
    "ClassifyPass",
    "ConstantRangePass",
    "FinalKernelPass",
    "KernelCoveragePass",
    "LoopAccumulatorPass",
    "MinCutPlacementPass",
    "NormFusionPass",
    "PaintPass",
    "PhaseArgumentPass",
    "PositionBiasPass",
    "QuantizedIslandPass",
    "ThresholdInputPass",
    "RangeFallbackPass",
    "RangeScalingPass",
    "RawOffsetProductPass",
    "RawSmallProductPass",
    "RoutingScorePass",
    "RuntimeHazardPass",
    "SignalPathPass",
    "StaticRangePass",
    "TolerancePinPass",
    "UserChoices",
    "compile_patterns",
]
