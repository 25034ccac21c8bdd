"""The written model's output error against FP32: integer outputs (labels, TopK's indices) are compared
value by value, and any change is stated."""

from __future__ import annotations

from amp_compiler import convert
from amp_compiler.onnx.measure.output_error import misses
from tests.support.onnx_builders import CLEAR_WEIGHTS, NEAR_TIE_WEIGHTS, label_model


def test_convert_states_the_share_of_labels_fp16_changes():
    """Before: an ArgMax-only model's accuracy was empty (integer outputs were never compared)."""
    (label,) = convert(label_model(NEAR_TIE_WEIGHTS)).accuracy
    assert label.name == "label" and label.exact and label.values == 64
    assert 0 < label.changed < 64 and misses(label)  # the rows with x[:, 0] > 0: about half


def test_topks_indices_are_compared_beside_its_float_values():
    by_name = {a.name: a for a in convert(label_model(NEAR_TIE_WEIGHTS, topk=True)).accuracy}
    assert set(by_name) == {"top", "classes"}
    assert not by_name["top"].exact and not misses(by_name["top"])  # equal scores: the values agree
    assert by_name["classes"].values == 128 and 0 < by_name["classes"].changed < 128 and misses(by_name["classes"])


def test_labels_that_do_not_change_state_zero_changed():
    (label,) = convert(label_model(CLEAR_WEIGHTS)).accuracy
    assert label.changed == 0 and label.values == 64 and label.changed_share == 0.0 and not misses(label)


def test_a_ties_move_is_read_from_every_samples_pairs_together():
    """A classifier of one row a sample: each sample holds a handful of pairs near a tie, whose 99th percentile
    is their max; the probe's statement pools them, as calibration's and the FX path's do (sweep C2: a keyword
    spotter stated 3.8% from one pair, 0.75% at constructed ties)."""
    import numpy as np
    from onnx import helper

    from amp_compiler.onnx.measure.output_error import output_accuracy, worst_accuracy
    from amp_compiler.runtime.runner import InProcessRunner
    from tests.support.onnx_builders import F32, model, tensor, vi, weights

    m = model([helper.make_node("MatMul", ["x", "w"], ["z"], name="head"),
               helper.make_node("Softmax", ["z"], ["p"], name="softmax", axis=-1)],
              [vi("x", F32, [1, 64])], [vi("p", F32, [1, 100])], [tensor("w", weights((64, 100), scale=1.0))])
    converted = convert(m, probe=False).model
    samples = [{"x": np.random.default_rng(s).standard_normal((1, 64)).astype(np.float32)} for s in range(12)]
    ((worst, _),) = worst_accuracy(m, converted, samples, InProcessRunner())
    (pooled,) = output_accuracy(m, converted, samples, InProcessRunner())
    assert worst.tie_move is not None and worst.tie_move == pooled.tie_move
