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
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from amp_compiler.convert import convert
    from amp_compiler.decisions import NodeDecision
    from amp_compiler.errors import AmpUserError
    from amp_compiler.options import ConvertOptions
    from amp_compiler.result import ConversionResult
    from amp_compiler.targets import Provider, Target

#: Where each public name is defined.
_PUBLIC = {
    "AmpUserError": "amp_compiler.errors",
    "ConversionResult": "amp_compiler.result",
    "ConvertOptions": "amp_compiler.options",
    "NodeDecision": "amp_compiler.decisions",
    "Provider": "amp_compiler.targets",
    "Target": "amp_compiler.targets",
    "convert": "amp_compiler.convert",
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


class _Package(types.ModuleType):
    """The package, whose ``convert`` is always the function: importing the submodule
    ``amp_compiler.convert`` binds the package attribute of that name to the module, which would
    hide the lazily imported function (an eager ``from ... import convert`` rebound it afterwards).
    Binding a function to it (a test's monkeypatch) works as for any module attribute."""

    @property
    def convert(self) -> Any:
        bound = self.__dict__.get("_convert_bound")
        return bound if bound is not None else importlib.import_module("amp_compiler.convert").convert

    @convert.setter
    def convert(self, value: Any) -> None:
        if not isinstance(value, types.ModuleType):  # the import system binding the submodule: ignored
            self.__dict__["_convert_bound"] = value


sys.modules[__name__].__class__ = _Package
