"""Graph passes, installed as ``amp_compiler.passes``.

Analysis passes (:class:`AnalysisPass`, in :mod:`amp_compiler.passes.base`) read a
:class:`~amp_compiler.graph.PrecisionGraph` and write a :class:`~amp_compiler.plan.PrecisionPlan`
(they never edit the model), and check their guarantees in ``ensures``; :mod:`amp_compiler.pipeline`
puts them in order: ``ClassifyPass`` (policy roles), ``TolerancePinPass`` (``--tolerance``'s choice: the
nodes it pinned stay FP32 without spreading, those it kept stay low), ``KernelCoveragePass`` (ops without a
low-precision kernel on the target provider stay FP32), ``RuntimeHazardPass`` (op patterns
onnxruntime crashes on with a Cast inside stay FP32), ``SignalPathPass`` (the linear path
from a raw input into a Log stays FP32), ``QuantizedIslandPass`` (values quantized again and
quantization scales stay FP32), ``ConstantRangePass`` (unrepresentable
constants), ``StaticRangePass`` (what provably overflows for the inputs' known
ranges), ``CalibrationRangePass`` (observed ranges), ``PaintPass`` (propagation),
``MinCutPlacementPass`` (cast bytes minimised exactly over painting's free choices).

Model passes follow onnx_ir's pass contract (``call(model) -> PassResult``): ``LowerPlanPass`` (apply
the plan), ``RemoveCancellingCastsPass`` (cleanup) and the opt-in ``PadTensorCoresPass`` (weights
padded to multiples of 8, sliced back) and, for ``--target fp8``, ``QuantizeGemmInputsPass`` (Q/DQ to
FP8 E4M3 before the chosen GEMMs' inputs).
"""

from amp_compiler.passes.base import AnalysisPass
from amp_compiler.passes.calibration import CalibrationRangePass
from amp_compiler.passes.classify import ClassifyPass, compile_patterns
from amp_compiler.passes.cleanup import RemoveCancellingCastsPass
from amp_compiler.passes.constants import ConstantRangePass
from amp_compiler.passes.coverage import KernelCoveragePass
from amp_compiler.passes.fp8 import QuantizeGemmInputsPass
from amp_compiler.passes.hazards import RuntimeHazardPass
from amp_compiler.passes.lower import ConvertedConstant, LowerPlanPass
from amp_compiler.passes.mincut import MinCutPlacementPass
from amp_compiler.passes.pad import PadTensorCoresPass
from amp_compiler.passes.paint import PaintPass
from amp_compiler.passes.pins import TolerancePinPass
from amp_compiler.passes.quantized import QuantizedIslandPass
from amp_compiler.passes.signal import SignalPathPass
from amp_compiler.passes.static_ranges import StaticRangePass

__all__ = [
    "AnalysisPass",
    "CalibrationRangePass",
    "ClassifyPass",
    "ConstantRangePass",
    "ConvertedConstant",
    "KernelCoveragePass",
    "LowerPlanPass",
    "MinCutPlacementPass",
    "PadTensorCoresPass",
    "PaintPass",
    "QuantizeGemmInputsPass",
    "QuantizedIslandPass",
    "RemoveCancellingCastsPass",
    "RuntimeHazardPass",
    "SignalPathPass",
    "StaticRangePass",
    "TolerancePinPass",
    "compile_patterns",
]
