"""Probability outputs (amp_compiler.core.probabilities): the class axis their rows sum to 1 along, how certain the
inputs left them, and how far a tie between two classes moves them, read back from the probabilities alone."""

from __future__ import annotations

import math

import numpy as np
import pytest

from amp_compiler.core.probabilities import (
    CERTAIN,
    FLOOR,
    MAX_ROWS,
    probability_axis,
    probability_output,
    saturation,
    tie_move,
)
from amp_compiler.core.tensor_error import accuracy


def _softmax(z: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(z - z.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def test_the_class_axis_is_the_one_whose_rows_sum_to_one():
    z = np.random.default_rng(0).standard_normal((2, 10, 3, 3))
    assert probability_axis(_softmax(z, axis=-1)) == 3
    assert probability_axis(_softmax(z, axis=1)) == 1  # a segmentation map's [B, C, H, W]
    assert probability_axis(_softmax(z[:, :, :1, :1], axis=1)) == 1  # a 1x1 conv head's [B, C, 1, 1]
    assert probability_axis(np.full((2, 4), 0.3)) is None  # rows summing to 1.2
    assert probability_axis(np.array([[2.0, -1.0]])) is None
    assert saturation([_softmax(z * 1e3, axis=1)]) > 0.9  # certain rows along the class axis


def test_saturation_is_the_share_of_certain_rows():
    certain = np.full((3, 4), 1e-6 / 3, np.float32)
    certain[:, 0] = 1 - 1e-6
    spread = np.full((1, 4), 0.25, np.float32)
    assert saturation([certain, spread]) == saturation([np.concatenate([certain, spread])]) == 0.75
    assert CERTAIN == 1 - 2**-12


def test_a_tie_moves_by_tanh_of_a_quarter_of_the_error_in_the_two_logits_difference():
    """Where two classes start d/2 apart an error d in their difference moves them by tanh(d / 4), the most it can;
    a sample of one row is at a tie then, its range the two classes' share (0.5); beside a certain row, 1."""
    d = 0.4
    ref, got = _softmax(np.array([[0.0, -d / 2]])), _softmax(np.array([[0.0, d / 2]]))
    assert np.abs(got - ref).max() == pytest.approx(math.tanh(d / 4), rel=1e-9)
    certain = np.array([[1.0 - 1e-9, 1e-9]])  # its runner-up below the floor: nothing of it read
    assert tie_move([ref], [got]) == pytest.approx(math.tanh(d / 4) / (ref.max() + ref.min()) * 2, rel=1e-6)
    assert tie_move([np.vstack([ref, certain])], [np.vstack([got, certain])]) == pytest.approx(
        math.tanh(d / 4) / (1.0 - 2e-9), rel=1e-6)


def test_errors_that_grow_with_the_logits_gap_do_not_move_a_tie():
    """A logit scale off by 1% moves a gap of 30 by 0.3 and a tie by nothing: the pairs near a tie are read."""
    z = np.random.default_rng(1).uniform(-30, 0, (200, 100))
    ref, got = _softmax(z), _softmax(z * 1.01)
    move = tie_move([ref], [got])
    assert move is not None and move <= math.tanh(3 * 0.01 / 4) / np.ptp(ref) * 1.001  # gaps of 3 at most
    all_pairs = np.abs(np.log(got / got.max(axis=1, keepdims=True)) - np.log(ref / ref.max(axis=1, keepdims=True)))
    assert math.tanh(np.percentile(all_pairs[ref >= FLOOR], 99) / 4) / np.ptp(ref) > 2 * move  # every pair read


def test_probabilities_below_fp16s_normals_are_not_read():
    """An output FP16 stored on its way holds its probabilities below 2^-14 as subnormals: rounding, not logit error."""
    z = np.random.default_rng(2).standard_normal((64, 1000)) * 4
    ref = _softmax(z)
    got = ref.astype(np.float16).astype(np.float64)
    assert tie_move([ref], [got]) < 0.002
    assert probability_output([ref], [got]).axis == 1


def test_accuracy_carries_them():
    z = np.random.default_rng(3).standard_normal((16, 50)) * 3
    ref, got = _softmax(z).astype(np.float32), _softmax(z + 0.05 * np.random.default_rng(4).standard_normal(z.shape))
    measured = accuracy("p", [ref], [got.astype(np.float32)])
    assert measured.saturated == 0.0 and measured.tie_move == pytest.approx(tie_move([ref], [got]), rel=1e-3)
    assert accuracy("x", [z], [z]).tie_move is None


def test_a_sample_of_many_rows_is_read_at_a_stride_the_same_for_both():
    """A segmentation map's 200,000 pixels: MAX_ROWS of them read, the FP32 and converted rows the same pixels."""
    z = np.random.default_rng(5).standard_normal((1, 4, 400, 500)) * 3
    ref = _softmax(z, axis=1).astype(np.float32)
    got = _softmax(z + 0.004 * np.random.default_rng(6).standard_normal(z.shape), axis=1).astype(np.float32)
    output = probability_output([ref], [got])
    assert 400 * 500 > MAX_ROWS and output is not None and output.axis == 1
    assert 0.001 < output.tie_move < math.tanh(0.04 / 4) / 0.5  # pixels' differences within 0.04: aligned rows


def test_a_sigmoids_values_are_two_class_rows():
    """Each value p of a Sigmoid's output is the row (p, 1 - p): its logit against 0 read back, an error d in it
    moving a value at 0.5 by tanh(d / 4), over the output's range (a map of many values: its own, at least 0.5)."""
    z = np.linspace(-2.0, 2.0, 300)
    ref, got = 1 / (1 + np.exp(-z)), 1 / (1 + np.exp(-(z + 0.2)))
    output = probability_output([ref], [got], logistic=True)
    assert output is not None and output.saturated == 0.0
    assert output.tie_move == pytest.approx(math.tanh(0.2 / 4) / np.ptp(ref), rel=1e-6)
    assert probability_output([ref], [got]) is None  # the same values, not known to be a Sigmoid's: no rows
    big = np.random.default_rng(7).uniform(0.1, 0.9, 4 * MAX_ROWS)
    assert probability_output([big], [big], logistic=True).tie_move == 0.0  # strided alike: no error read


def test_no_move_is_stated_where_no_pair_was_near_a_tie():
    """Six rows whose runner-ups sit 5.5-5.9 below their tops: what a tie does is not read from them (sweep W3: a
    keyword spotter warned of 2.5% from such pairs, 0.75% at constructed ties); one pair within 3 is enough."""
    gaps = np.array([5.5, 5.6, 5.7, 5.8, 5.9, 5.6])
    errors = np.array([0.01, 0.01, 0.01, 0.01, 0.01, 0.05])
    far = [_softmax(np.array([[0.0, -g]])) for g in gaps]
    moved = [_softmax(np.array([[0.0, -g + e]])) for g, e in zip(gaps, errors, strict=True)]
    assert tie_move(far, moved) is None
    near_ref, near_got = _softmax(np.array([[0.0, -1.0]])), _softmax(np.array([[0.0, -0.99]]))
    assert tie_move([*far, near_ref], [*moved, near_got]) is not None
