"""The written model's output error against FP32, measured with exact low-precision emulation.

One function for every conversion that ran the FP32 model (the range probe, calibration data): the
converted model, emulated exactly (:func:`~amp_compiler.onnx.measure.emulate.emulate`), runs once per
sample and each float output is compared with the FP32 outputs already in hand
(:func:`~amp_compiler.core.tensor_error.accuracy`: rel-L2, max error of range, cosine, NaN/Inf), each
integer or bool output (a label, TopK's indices) value by value
(:func:`~amp_compiler.core.tensor_error.exact_accuracy`: the emulation computes them exactly, so a
changed value is a changed answer), over all samples together (:func:`output_accuracy`) or on each
output's worst sample (:func:`worst_accuracy`). :func:`misses` is the line an output's error must stay
within before a warning is due; :func:`severity` orders outputs worst first.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx

from amp_compiler.core.measures import OutputAccuracy
from amp_compiler.core.probabilities import probability_output, saturation
from amp_compiler.core.tensor_error import accuracy, compared_outputs, exact_accuracy, output_accuracies
from amp_compiler.onnx.measure.chain import session_feeds
from amp_compiler.onnx.measure.emulate import emulate
from amp_compiler.runtime.input_uses import VALUES_KEPT
from amp_compiler.runtime.runner import Runner

__all__ = ["CONCENTRATION", "MAX_CHANGED_SHARE", "MAX_ERROR_OF_RANGE", "MIN_COSINE", "SATURATED", "concentrated",
           "logistic_outputs", "misses", "moves_at_ties", "output_accuracy", "saturated", "severity", "worst_accuracy"]

#: An output whose max error exceeds this share of its FP32 range, whose cosine is below
#: :data:`MIN_COSINE`, or that holds NaN/Inf where FP32 does not gets a warning.
MAX_ERROR_OF_RANGE = 0.02
MIN_COSINE = 0.999
#: An integer or bool output (labels, indices) more than this share of whose values differ from FP32's
#: gets a warning; any changed value is stated in the summary. FP16 flips a label only where the top two
#: scores are within its rounding (about 1e-3 relative): on held-out data a random 64-256-10 MLP's
#: ArgMax changed 12 of 20,000 labels (0.06%); past 1% the inputs sit on near-ties (a TopK over a noise
#: heatmap: 54% of its indices) or the conversion moved the scores, and either wants a check on real data.
MAX_CHANGED_SHARE = 0.01


def output_accuracy(
    fp32: onnx.ModelProto, converted: onnx.ModelProto, samples: list[dict[str, np.ndarray]], runner: Runner,
    refs: list[list[np.ndarray]] | None = None,
) -> list[OutputAccuracy]:
    """Each float, integer or bool output's accuracy over ``samples`` (all samples' values together).
    ``refs``: the FP32 model's outputs on them (graph output order) when already run; else it runs them too."""
    refs, gots = _outputs(fp32, converted, samples, runner, refs)
    return output_accuracies([o.name for o in fp32.graph.output], refs, gots, logistic_outputs(fp32))


def worst_accuracy(
    fp32: onnx.ModelProto, converted: onnx.ModelProto, samples: list[dict[str, np.ndarray]], runner: Runner,
    refs: list[list[np.ndarray]] | None = None,
) -> list[tuple[OutputAccuracy, int]]:
    """Each float, integer or bool output's accuracy on the sample where it is worst (NaN/Inf first,
    then past the line, then the largest max error of range or share of changed values), with that
    sample's index: samples of different kinds
    (the range probe's noise and dead-leaves images) are not pooled, so one kind's error shows whole."""
    refs, gots = _outputs(fp32, converted, samples, runner, refs)
    logistic = logistic_outputs(fp32)
    out = []
    for k, name, exact in compared_outputs([o.name for o in fp32.graph.output], refs):
        each = [exact_accuracy(name, [ref[k]], [got[k]]) if exact
                else accuracy(name, [ref[k]], [got[k]], probabilities=False)
                for ref, got in zip(refs, gots, strict=True)]
        worst = max(range(len(each)), key=lambda i: (not each[i].finite, misses(each[i]), _badness(each[i])))
        if exact or not all(a.finite for a in each):
            out.append((each[worst], worst))
            continue
        # the worst sample's saturation; a tie's move from every sample's pairs together: one sample of one row
        # holds a handful, whose 99th percentile is their max (sweep C2: a keyword spotter's 3.8% from one pair;
        # 0.75% at constructed ties)
        pooled = probability_output([r[k] for r in refs], [g[k] for g in gots], logistic=name in logistic)
        out.append((dataclasses.replace(
            each[worst], saturated=saturation([refs[worst][k]], logistic=name in logistic),
            tie_move=pooled.tie_move if pooled else None), worst))
    return out



def logistic_outputs(model: onnx.ModelProto) -> set[str]:
    """The graph outputs a Sigmoid computes, directly or through data movement (:data:`VALUES_KEPT`): each value
    one of two classes' probability (a binary classifier's score, a tagger's labels), measured as such
    (:func:`~amp_compiler.core.probabilities.probability_output`)."""
    producers = {o: n for n in model.graph.node for o in n.output}
    found = set()
    for output in model.graph.output:
        node = producers.get(output.name)
        while node is not None and node.op_type in VALUES_KEPT and node.domain in ("", "ai.onnx") and node.input:
            node = producers.get(node.input[0])
        if node is not None and node.op_type == "Sigmoid" and node.domain in ("", "ai.onnx"):
            found.add(output.name)
    return found


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
    session = runner.load(model, basic=True)  # a run per sample: the full optimizer's time is not won back
    try:
        types = dict(zip(session.input_names, session.input_types, strict=True))
        return [session.run(session_feeds(sample, types)) for sample in samples]
    finally:
        session.close()


def misses(accuracy: OutputAccuracy) -> bool:
    """Whether an output's error is past the line: for an integer/bool output more than
    :data:`MAX_CHANGED_SHARE` of its values changed; for a float output NaN/Inf where FP32 is finite,
    max error above :data:`MAX_ERROR_OF_RANGE` of its range, or cosine below :data:`MIN_COSINE`."""
    if accuracy.exact:
        return (accuracy.changed_share or 0.0) > MAX_CHANGED_SHARE
    return not accuracy.finite or accuracy.error_of_range > MAX_ERROR_OF_RANGE or accuracy.cosine < MIN_COSINE


#: An output whose worst row (:attr:`~amp_compiler.core.measures.OutputAccuracy.concentration`, relative to its
#: own magnitude) stands this many times above its 90th-percentile row is :func:`concentrated`. FP16 rounding
#: moves every position alike: over the catalog's small models (LMs, encoders, KV caches, image and audio
#: models, hand-built graphs; the default conversion's probe) and 100 models of earlier sweeps (sweep W) every
#: output within the line had its worst row 1.0-3.0 times the 90th percentile. A few positions far beyond the
#: rest are rounding amplified by a near-cancellation those inputs hit (a Llama whose massive SwiGLU unit
#: multiplies a gate that cancels to near 0 by an up projection in the thousands: worst token 13x the 90th
#: percentile on the probe's 128 tokens).
CONCENTRATION = 5.0


def concentrated(accuracy: OutputAccuracy) -> bool:
    """Whether a float output within the line (not :func:`misses`) has its error in a few positions whose
    error, as far beyond the measured max as that max is beyond the bulk, would miss it: its worst row stands
    :data:`CONCENTRATION` times or more above its 90th percentile, and the max error times that factor passes
    :data:`MAX_ERROR_OF_RANGE`. The measured max then says how close the inputs measured came to the
    condition that amplifies rounding, not how far other inputs (more tokens, other tokens) can go: the Llama
    above, stated 0.34% on the probe's 128 tokens (13x its 90th percentile), was 0.11-5.4% of range on 12
    held-out draws of 256 tokens; a token-wise stack of such SwiGLU layers (catalog ``massive-swiglu-tail``)
    0.40% on the probe's 128 (12x), 0.6-9.7% on 8 draws of 512."""
    factor = accuracy.concentration
    if accuracy.exact or misses(accuracy) or not accuracy.measured or factor is None:
        return False
    return factor >= CONCENTRATION and accuracy.error_of_range * factor > MAX_ERROR_OF_RANGE


def _badness(accuracy: OutputAccuracy) -> float:
    """The error an output is ranked by: its share of changed values (integer/bool), else its max error of range."""
    return accuracy.changed_share if accuracy.changed_share is not None else accuracy.error_of_range


def severity(accuracy: OutputAccuracy) -> tuple[bool, bool, bool, float]:
    """A sort key, worst output first: NaN/Inf, then past the line (:func:`misses`), then not measured
    (FP32's own values NaN/Inf: its error is unknown), then the larger share of changed values or max
    error of range."""
    return accuracy.finite, not misses(accuracy), accuracy.measured, -_badness(accuracy)


#: A probability output whose top value low precision holds as 1 in this share of its rows or more
#: (:attr:`~amp_compiler.core.measures.OutputAccuracy.saturated`) was not exercised by the inputs measured.
SATURATED = 0.99


def moves_at_ties(accuracy: OutputAccuracy) -> bool:
    """Whether a probability output within the line (not :func:`misses`) would pass it where two of its classes
    tie: the conversion's error in its logits' differences, measured on the inputs, moves a tie's probability by
    more than :data:`MAX_ERROR_OF_RANGE` (:attr:`~amp_compiler.core.measures.OutputAccuracy.tie_move`). Its
    measured error then says how seldom the inputs measured tied, not how far real inputs that tie go."""
    return accuracy.tie_move is not None and accuracy.tie_move > MAX_ERROR_OF_RANGE and not misses(accuracy)


def saturated(accuracy: OutputAccuracy) -> bool:
    """Whether a probability output within the line (not :func:`misses`) was certain everywhere on the inputs
    measured (:data:`SATURATED`): FP16 moves nothing there, so its error on them says nothing of the near-ties
    other inputs reach (Magika on random bytes: 0.00% stated, 1.47% of range on real files)."""
    return accuracy.saturated is not None and accuracy.saturated >= SATURATED and not misses(accuracy)

