"""The written model's output error against FP32, measured with exact low-precision emulation.

One function for every conversion that ran the FP32 model (the range probe, calibration data): the
converted model, emulated exactly (:func:`~amp_compiler.onnx.measure.emulate.emulate`), runs once per
sample and each float output is compared with the FP32 outputs already in hand
(:func:`~amp_compiler.core.tensor_error.accuracy`: rel-L2, max error of range, cosine, NaN/Inf), over
all samples together (:func:`output_accuracy`) or on each output's worst sample (:func:`worst_accuracy`).
:func:`misses` is the line an output's error must stay within before a warning is due.
"""

from __future__ import annotations

import numpy as np
import onnx

from amp_compiler.core.measures import OutputAccuracy
from amp_compiler.core.tensor_error import accuracy
from amp_compiler.onnx.measure.chain import session_feeds
from amp_compiler.onnx.measure.emulate import emulate
from amp_compiler.runtime.runner import Runner

__all__ = ["MAX_ERROR_OF_RANGE", "MIN_COSINE", "misses", "output_accuracy", "worst_accuracy"]

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
    refs, gots = _outputs(fp32, converted, samples, runner, refs)
    return [accuracy(name, [r[k] for r in refs], [g[k] for g in gots]) for k, name in _float_outputs(fp32, refs)]


def worst_accuracy(
    fp32: onnx.ModelProto, converted: onnx.ModelProto, samples: list[dict[str, np.ndarray]], runner: Runner,
    refs: list[list[np.ndarray]] | None = None,
) -> list[tuple[OutputAccuracy, int]]:
    """Each float output's accuracy on the sample where it is worst (NaN/Inf first, then past the
    line, then the largest max error of range), with that sample's index: samples of different kinds
    (the range probe's noise and dead-leaves images) are not pooled, so one kind's error shows whole."""
    refs, gots = _outputs(fp32, converted, samples, runner, refs)
    out = []
    for k, name in _float_outputs(fp32, refs):
        each = [accuracy(name, [ref[k]], [got[k]]) for ref, got in zip(refs, gots, strict=True)]
        worst = max(range(len(each)), key=lambda i: (not each[i].finite, misses(each[i]), each[i].error_of_range))
        out.append((each[worst], worst))
    return out


def _outputs(
    fp32: onnx.ModelProto, converted: onnx.ModelProto, samples: list[dict[str, np.ndarray]], runner: Runner,
    refs: list[list[np.ndarray]] | None,
) -> tuple[list[list[np.ndarray]], list[list[np.ndarray]]]:
    """The FP32 model's outputs per sample (``refs`` when given) and the emulated converted model's."""
    if refs is None:
        refs = _run_all(runner, fp32, samples)
    # exact FP16/BF16 storage, whatever the CPU kernels do; its FP16 inputs are FP32 (rounded on entry)
    return refs, _run_all(runner, emulate(converted), samples)


def _run_all(runner: Runner, model: onnx.ModelProto, samples: list[dict[str, np.ndarray]]) -> list[list[np.ndarray]]:
    """``model``'s outputs on each sample, its float arrays in the types the model's inputs take."""
    session = runner.load(model)
    try:
        types = dict(zip(session.input_names, session.input_types, strict=True))
        return [session.run(session_feeds(sample, types)) for sample in samples]
    finally:
        session.close()


def _float_outputs(fp32: onnx.ModelProto, refs: list[list[np.ndarray]]) -> list[tuple[int, str]]:
    """(position, name) of the graph outputs that are floats in every sample's FP32 outputs."""
    return [(k, info.name) for k, info in enumerate(fp32.graph.output)
            if all(np.issubdtype(np.asarray(r[k]).dtype, np.floating) for r in refs)]


def misses(accuracy: OutputAccuracy) -> bool:
    """Whether an output's error is past the line: NaN/Inf where FP32 is finite, max error above
    :data:`MAX_ERROR_OF_RANGE` of its range, or cosine below :data:`MIN_COSINE`."""
    return not accuracy.finite or accuracy.error_of_range > MAX_ERROR_OF_RANGE or accuracy.cosine < MIN_COSINE
