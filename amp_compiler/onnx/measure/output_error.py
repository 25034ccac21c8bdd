"""The written model's output error against FP32, measured with exact low-precision emulation.

One function for every conversion that ran the FP32 model (the range probe, calibration data): the
converted model, emulated exactly (:func:`~amp_compiler.onnx.measure.emulate.emulate`), runs once per
sample and each float output is compared with the FP32 outputs already in hand
(:func:`~amp_compiler.core.tensor_error.accuracy`: rel-L2, max error of range, cosine, NaN/Inf).
:func:`misses` is the line an output's error must stay within before a warning is due.
"""

from __future__ import annotations

import numpy as np
import onnx

from amp_compiler.core.measures import OutputAccuracy
from amp_compiler.core.tensor_error import accuracy
from amp_compiler.onnx.measure.emulate import emulate
from amp_compiler.runtime.runner import Runner

__all__ = ["MAX_ERROR_OF_RANGE", "MIN_COSINE", "misses", "output_accuracy"]

#: An output whose max error exceeds this share of its FP32 range, whose cosine is below
#: :data:`MIN_COSINE`, or that holds NaN/Inf where FP32 does not gets a warning.
MAX_ERROR_OF_RANGE = 0.02
MIN_COSINE = 0.999


def output_accuracy(
    fp32: onnx.ModelProto, converted: onnx.ModelProto, samples: list[dict[str, np.ndarray]], runner: Runner,
    refs: list[list[np.ndarray]] | None = None,
) -> list[OutputAccuracy]:
    """Each float output's accuracy over ``samples`` (all samples' values together). ``refs``: the FP32
    model's outputs on them (graph output order) when already run; else it runs them too."""
    if refs is None:
        reference = runner.load(fp32)
        try:
            refs = [reference.run(sample) for sample in samples]
        finally:
            reference.close()
    mixed = runner.load(emulate(converted))  # exact FP16/BF16 storage, whatever the CPU kernels do
    try:
        gots = [mixed.run(sample) for sample in samples]
    finally:
        mixed.close()
    out = []
    for k, info in enumerate(fp32.graph.output):
        ref = [r[k] for r in refs]
        if not all(np.issubdtype(np.asarray(r).dtype, np.floating) for r in ref):
            continue
        out.append(accuracy(info.name, ref, [g[k] for g in gots]))
    return out


def misses(accuracy: OutputAccuracy) -> bool:
    """Whether an output's error is past the line: NaN/Inf where FP32 is finite, max error above
    :data:`MAX_ERROR_OF_RANGE` of its range, or cosine below :data:`MIN_COSINE`."""
    return not accuracy.finite or accuracy.error_of_range > MAX_ERROR_OF_RANGE or accuracy.cosine < MIN_COSINE
