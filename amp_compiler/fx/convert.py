"""amp_compiler.fx.convert: an ``nn.Module`` to a mixed-precision GraphModule for inference.

FP16 and BF16 run the FX pipeline (:mod:`amp_compiler.fx.graph.pipeline`); FP8 first chooses its
GEMMs from calibration samples (:mod:`amp_compiler.fx.fp8.inference`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.fx as fx

from amp_compiler import targets
from amp_compiler.errors import OptionError
from amp_compiler.fx.graph.pipeline import capture_for_inference, transform
from amp_compiler.fx.graph.policy import AtenPolicy
from amp_compiler.targets import Target

__all__ = ["convert"]


def convert(
    model: torch.nn.Module,
    example_inputs: Any,
    example_kwargs: dict | None = None,
    *,
    target: Target | str = "fp16",
    block_ops: Iterable[str] = (),
    block_nodes: Iterable[str] = (),
    dynamic_shapes: Any = None,
    fold_bn: bool = True,
    placement: str = "mincut",
    policy: AtenPolicy | None = None,
    calibration: Iterable[Any] | None = None,
    fp8_margin: int = targets.FP8_MARGIN,
    fp8_budget: float = targets.FP8_BUDGET,
    fp8_max_error: float = targets.FP8_MAX_ERROR,
    fp8_max_subnormal: float = targets.FP8_MAX_SUBNORMAL,
) -> fx.GraphModule:
    """Convert ``model`` to a mixed-precision GraphModule for inference, with explicit casts.

    The model is captured with ``torch.export`` (ATen-level) in its current mode (call
    ``model.eval()`` first for inference). Graph inputs and outputs keep their dtypes. Parameters and
    buffers whose every use is low precision are stored in low precision on the returned module (the
    caller's model is untouched: the parameters and buffers the forward writes are the module's own
    copies); ``report(gm)`` gives every node's decision and the memory saved.
    With ``fold_bn`` (the default), eval-mode batch norms that only read a convolution are folded
    into it first, in FP32, as ``torch.onnx.export`` does.

    ``target="fp8"`` needs ``calibration``: samples of inputs, each given as the example is (a tuple
    like ``example_inputs`` or one tensor; an ``(args, kwargs)`` pair with ``example_kwargs``). Matrix
    products (linear, mm, addmm, bmm, matmul) whose statistics on them allow it take FP8 E4M3 inputs
    (``fp8_*``: the ONNX path's ``--fp8-*`` settings); everything else is converted as for FP16
    (:mod:`amp_compiler.fx.fp8.inference`).
    """
    target = Target.parse(target) if isinstance(target, str) else target
    inputs = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    if target is Target.FP8:
        from amp_compiler.fx.fp8.inference import convert_fp8, fp8_options

        opts = fp8_options(fp8_margin, fp8_budget, fp8_max_error, fp8_max_subnormal)
        return convert_fp8(model, inputs, example_kwargs, calibration=calibration, opts=opts, block_ops=block_ops,
                           block_nodes=block_nodes, dynamic_shapes=dynamic_shapes, fold_bn=fold_bn,
                           placement=placement, policy=policy)
    if calibration is not None:
        raise OptionError("calibration samples are for target fp8 only", option="calibration")
    captured = capture_for_inference(model, inputs, example_kwargs, dynamic_shapes=dynamic_shapes, fold_bn=fold_bn)
    transform(captured.gm, target, mode="inference", block_ops=block_ops, block_nodes=block_nodes, policy=policy,
              parameter_bytes_before=captured.bytes_before, notes=captured.notes, placement=placement)
    return captured.gm
