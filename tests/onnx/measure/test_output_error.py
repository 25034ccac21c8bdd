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
