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
from amp_compiler.fx.fp8.inference import calibration_samples, graph_inputs
from amp_compiler.fx.graph.accuracy import accuracy_warnings, output_accuracy
from amp_compiler.fx.graph.pipeline import capture_for_inference, transform
from amp_compiler.fx.graph.policy import AtenPolicy
from amp_compiler.fx.graph.probe_inputs import token_id_samples
from amp_compiler.fx.graph.ranges import ObservedRanges, calibration_ranges, probe_ranges
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
    probe: bool = True,
    range_fallback: str = "bf16",
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

    FP16 and BF16 observe the FP32 graph's activation ranges first (:mod:`amp_compiler.fx.graph.ranges`):
    on the ``calibration`` samples where given (rules ``calibration.overflow``/``underflow``, as the ONNX
    path's ``--calibration-data``), else on the example inputs (``probe.overflow``/``underflow``, as its
    range probe; ``probe=False`` skips that run, as the ONNX path's ``--no-probe``, and the report warns
    that ranges were not checked), with samples of token ids drawn below the vocabulary beside them where
    an input holds token ids and the example holds fewer than 256 (:mod:`amp_compiler.fx.graph.probe_inputs`).
    What overflows or underflows the target stays FP32, but for
    ``target="fp16"`` the matrix products and convolutions among it: with ``range_fallback="bf16"`` (the
    default, as the ONNX path's for the CUDA provider) they run in BF16, FP32's range on BF16 Tensor Cores
    (Ampere, sm_80, and later); give ``"fp32"`` for GPUs without them (Turing, Volta).
    """
    target = Target.parse(target) if isinstance(target, str) else target
    inputs = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    if target is Target.FP8:
        from amp_compiler.fx.fp8.inference import convert_fp8, fp8_options

        opts = fp8_options(fp8_margin, fp8_budget, fp8_max_error, fp8_max_subnormal)
        return convert_fp8(model, inputs, example_kwargs, calibration=calibration, opts=opts, block_ops=block_ops,
                           block_nodes=block_nodes, dynamic_shapes=dynamic_shapes, fold_bn=fold_bn,
                           placement=placement, policy=policy)
    given = _calibration(calibration, inputs, example_kwargs, dynamic_shapes)
    captured = capture_for_inference(model, inputs, example_kwargs, dynamic_shapes=dynamic_shapes, fold_bn=fold_bn)
    gm = captured.gm
    samples: list[tuple] = []  # what the ranges are observed, and the conversion measured, on
    if given:
        samples = [graph_inputs(gm, args, kwargs) for args, kwargs in given]
        observed = calibration_ranges(gm, samples)
    elif probe:
        example = graph_inputs(gm, inputs, example_kwargs or {})
        generated = token_id_samples(gm, example)
        observed = probe_ranges(gm, example, generated)
        samples = [example, *generated][: observed.runs]  # the example alone where the generated did not run
    else:
        observed = ObservedRanges.unchecked("probe=False and no calibration samples")
    report = transform(gm, target, mode="inference", block_ops=block_ops, block_nodes=block_nodes, policy=policy,
                       parameter_bytes_before=captured.bytes_before, notes=captured.notes, placement=placement,
                       observed=observed, range_fallback=range_fallback)
    if observed.outputs:  # measured before it is returned, on the inputs the ranges came from
        report.accuracy = output_accuracy(gm, samples, observed.outputs, report.output_names)
        report.warnings.extend(accuracy_warnings(report.accuracy, observed.seen))
    return gm


def _calibration(
    calibration: Iterable[Any] | None, inputs: tuple, example_kwargs: dict | None, dynamic_shapes: Any
) -> list[tuple[tuple, dict]]:
    """The calibration samples as ``(args, kwargs)`` pairs, checked against the example (none: [])."""
    if calibration is None:
        return []
    samples = list(calibration)
    if not samples:
        raise OptionError("calibration is empty: give samples like example_inputs, or leave it out",
                          option="calibration")
    return calibration_samples(samples, inputs, example_kwargs, same_shapes=dynamic_shapes is None)
