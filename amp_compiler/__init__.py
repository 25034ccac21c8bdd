"""amp-compiler: mixed-precision (FP16/BF16/FP8) compilation of ONNX and torch.fx graphs.

    from amp_compiler import convert
    result = convert("model.onnx", target="fp16")   # or an onnx.ModelProto
    onnx.save(result.model, "model.fp16.onnx")
    for d in result.decisions: print(d.node, d.precision, d.rule, d.reason)

The public names, all importable from here:

- converting: :func:`convert`, :class:`ConvertOptions`, :class:`ConversionResult` (one
  :class:`NodeDecision` per node), :class:`Target`, :class:`Provider`;
- explaining and measuring: :func:`analyze` (convert, measure, report: :class:`Analysis`, whose
  :class:`PrecisionReport` renders as text, JSON, CSV or HTML), :func:`refine` (``--tolerance``:
  :class:`Refinement`), :func:`compare_models` (:class:`Comparison`), :func:`collect_ranges`
  (calibration ranges), :func:`load_samples` (calibration data read safely);
- exact low-precision storage on a CPU: :func:`emulate`, :func:`emulate_bf16`;
- running untrusted models: :class:`Runner`, :class:`ChildRunner` (a child process within a
  :class:`RunBudget`), :class:`InProcessRunner` (trusted models only);
- strongly typed runtimes: :func:`undecided_values` (tensors whose type a graph leaves open);
- errors a user can act on derive from :class:`AmpUserError`.

The PyTorch path lives in ``amp_compiler.fx`` and is the only place that imports torch. The names
above are imported on first use, so that importing the package (the command line, ``--version``)
costs nothing until a conversion is asked for.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from amp_compiler.analysis import Analysis, analyze
    from amp_compiler.core.decision import NodeDecision
    from amp_compiler.errors import AmpUserError
    from amp_compiler.onnx.compare import Comparison, compare_models
    from amp_compiler.onnx.convert import convert
    from amp_compiler.onnx.measure.calibrate import collect_ranges
    from amp_compiler.onnx.measure.emulate import emulate, emulate_bf16
    from amp_compiler.onnx.tolerance.refine import Refinement, refine
    from amp_compiler.onnx.write.result import ConversionResult
    from amp_compiler.onnx.write.strongly_typed import undecided_values
    from amp_compiler.options import ConvertOptions
    from amp_compiler.report.model import PrecisionReport
    from amp_compiler.runtime.budget import RunBudget
    from amp_compiler.runtime.runner import ChildRunner, InProcessRunner, Runner
    from amp_compiler.runtime.samples import load_samples
    from amp_compiler.targets import Provider, Target

#: Where each public name is defined.
_PUBLIC = {
    "AmpUserError": "amp_compiler.errors",
    "Analysis": "amp_compiler.analysis",
    "ChildRunner": "amp_compiler.runtime.runner",
    "Comparison": "amp_compiler.onnx.compare",
    "ConversionResult": "amp_compiler.onnx.write.result",
    "ConvertOptions": "amp_compiler.options",
    "InProcessRunner": "amp_compiler.runtime.runner",
    "NodeDecision": "amp_compiler.core.decision",
    "PrecisionReport": "amp_compiler.report.model",
    "Provider": "amp_compiler.targets",
    "Refinement": "amp_compiler.onnx.tolerance.refine",
    "RunBudget": "amp_compiler.runtime.budget",
    "Runner": "amp_compiler.runtime.runner",
    "Target": "amp_compiler.targets",
    "analyze": "amp_compiler.analysis",
    "collect_ranges": "amp_compiler.onnx.measure.calibrate",
    "compare_models": "amp_compiler.onnx.compare",
    "convert": "amp_compiler.onnx.convert",
    "emulate": "amp_compiler.onnx.measure.emulate",
    "emulate_bf16": "amp_compiler.onnx.measure.emulate",
    "load_samples": "amp_compiler.runtime.samples",
    "refine": "amp_compiler.onnx.tolerance.refine",
    "undecided_values": "amp_compiler.onnx.write.strongly_typed",
}

__all__ = [
    "AmpUserError", "Analysis", "ChildRunner", "Comparison", "ConversionResult", "ConvertOptions",
    "InProcessRunner", "NodeDecision", "PrecisionReport", "Provider", "Refinement", "RunBudget", "Runner", "Target",
    "analyze", "collect_ranges", "compare_models", "convert", "emulate", "emulate_bf16", "load_samples", "refine",
    "undecided_values",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'amp_compiler' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
