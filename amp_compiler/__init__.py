"""amp-compiler: mixed-precision (FP16/BF16) compilation of ONNX and torch.fx graphs.

    from amp_compiler import convert
    result = convert("model.onnx", target="fp16")   # or an onnx.ModelProto
    onnx.save(result.model, "model.fp16.onnx")
    for d in result.decisions: print(d.node, d.precision, d.rule, d.reason)

The PyTorch path lives in ``amp_compiler.fx`` and is the only place that imports torch. The names
below are imported on first use, so that importing the package (the command line, ``--version``)
costs nothing until a conversion is asked for.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from amp_compiler.core.decision import NodeDecision
    from amp_compiler.errors import AmpUserError
    from amp_compiler.onnx.convert import convert
    from amp_compiler.onnx.write.result import ConversionResult
    from amp_compiler.options import ConvertOptions
    from amp_compiler.targets import Provider, Target

#: Where each public name is defined.
_PUBLIC = {
    "AmpUserError": "amp_compiler.errors",
    "ConversionResult": "amp_compiler.onnx.write.result",
    "ConvertOptions": "amp_compiler.options",
    "NodeDecision": "amp_compiler.core.decision",
    "Provider": "amp_compiler.targets",
    "Target": "amp_compiler.targets",
    "convert": "amp_compiler.onnx.convert",
}

__all__ = ["AmpUserError", "ConversionResult", "ConvertOptions", "NodeDecision", "Provider", "Target", "convert"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'amp_compiler' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
