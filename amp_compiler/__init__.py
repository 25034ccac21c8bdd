"""amp-compiler: mixed-precision (FP16/BF16) compilation of ONNX and torch.fx graphs.

    from amp_compiler import convert
    result = convert("model.onnx", target="fp16")   # or an onnx.ModelProto
    onnx.save(result.model, "model.fp16.onnx")
    for d in result.decisions: print(d.node, d.precision, d.rule, d.reason)

The PyTorch path lives in ``amp_compiler.fx`` and is the only place that imports torch.
"""

from amp_compiler.convert import convert
from amp_compiler.decisions import NodeDecision
from amp_compiler.errors import AmpUserError
from amp_compiler.options import ConvertOptions
from amp_compiler.result import ConversionResult
from amp_compiler.targets import Provider, Target

__all__ = [
    "AmpUserError",
    "ConversionResult",
    "ConvertOptions",
    "NodeDecision",
    "Provider",
    "Target",
    "convert",
]
__version__ = "0.1.0"
