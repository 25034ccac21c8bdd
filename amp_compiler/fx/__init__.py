"""The PyTorch path: mixed precision on torch.fx graphs (the only part of amp-compiler that imports torch).

    import amp_compiler.fx as ampfx
    gm = ampfx.convert(model, example_inputs, target="fp16")     # GraphModule with explicit casts
    print(ampfx.report(gm))                                       # every node's decision and why
    gm8 = ampfx.convert(model, example_inputs, target="fp8", calibration=[inputs, ...])  # FP8 GEMMs
    step = ampfx.prepare_training(model, loss_fn, (x, y), target="fp16", loss_scale="dynamic")
    step8 = ampfx.prepare_training(model, loss_fn, (x, y), target="fp8", fp8_recipe=ampfx.DelayedScaling())
    loss = step(x, y, optimizer)                                  # scaled, unscaled, skipped on inf/NaN
    compiled = torch.compile(model, backend=ampfx.backend(target="fp16"))
    compiled = ampfx.compile(model, target="fp16")                  # the same, warns if nothing reached it
    onnx_model = ampfx.export_onnx(gm, example_inputs)               # at an opset valid for its types
"""

try:
    import torch  # noqa: F401 - the one requirement of this package, checked first for a clear message
except ImportError:
    raise ImportError(
        "amp_compiler.fx needs PyTorch, which is not installed: pip install 'amp-compiler[torch]' "
        "(or convert an ONNX model with amp_compiler.convert)"
    ) from None

from amp_compiler.fx.backend import AmpBackend, CompiledModule, NoGraphWarning, backend, compile  # noqa: E402
from amp_compiler.fx.convert import convert  # noqa: E402
from amp_compiler.fx.export import export_onnx  # noqa: E402
from amp_compiler.fx.fp8.scaling import DelayedScaling  # noqa: E402
from amp_compiler.fx.graph.pipeline import AmpInternalError, capture, report, transform  # noqa: E402
from amp_compiler.fx.graph.policy import default_policy  # noqa: E402
from amp_compiler.fx.graph.report import FxReport  # noqa: E402
from amp_compiler.fx.scaler import LossScaler  # noqa: E402
from amp_compiler.fx.training import TrainStep, prepare_training  # noqa: E402

__all__ = [
    "AmpBackend",
    "AmpInternalError",
    "CompiledModule",
    "DelayedScaling",
    "FxReport",
    "LossScaler",
    "NoGraphWarning",
    "TrainStep",
    "backend",
    "capture",
    "compile",
    "convert",
    "default_policy",
    "export_onnx",
    "prepare_training",
    "report",
    "transform",
]
