"""ONNX model passes (onnx_ir's contract: ``call(model) -> PassResult``), run after the analysis.

``LowerPlanPass`` applies the plan (element types, converted constants, one Cast per tensor and
type), ``ScaledProductsPass`` runs the range-scaled Tensor Core ops in FP16 on power-of-two scaled
operands, ``RemoveCancellingCastsPass`` removes identity and cancelling Casts, the opt-in
``PadTensorCoresPass`` pads weights to multiples of 8 (sliced back), the opt-in ``SplitProductsPass``
writes the Tensor Core ops kept in FP32 for their precision TF32-proof, and for ``--target fp8``
``QuantizeGemmInputsPass`` puts Q/DQ to FP8 E4M3 before the chosen GEMMs' inputs.
"""

from amp_compiler.passes.onnx.cleanup import RemoveCancellingCastsPass
from amp_compiler.passes.onnx.lower import ConvertedConstant, LowerPlanPass
from amp_compiler.passes.onnx.pad import PadTensorCoresPass
from amp_compiler.passes.onnx.qdq import QuantizeGemmInputsPass
from amp_compiler.passes.onnx.scale import ScaledProductsPass
from amp_compiler.passes.onnx.split_products import SplitProductsPass

__all__ = [
    "ConvertedConstant",
    "LowerPlanPass",
    "PadTensorCoresPass",
    "QuantizeGemmInputsPass",
    "RemoveCancellingCastsPass",
    "ScaledProductsPass",
    "SplitProductsPass",
]
