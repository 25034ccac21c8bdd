"""The error metrics of a run's outputs (OutputErrors): relative L2 as before, max error of range,
1 - cosine, argmax changes, and the user's callable, each infinite where an output is not finite
where FP32 is; an output's accuracy (cosine, max error of range, relative L2, NaN/Inf) from the same
statistics."""

from __future__ import annotations

import math

import numpy as np
import pytest

from amp_compiler.core.tensor_error import ErrorStats, Metric, OutputErrors, accuracy, metric_name, parse_metric
from amp_compiler.errors import OptionError

REF = [np.array([[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]]), np.array([10.0, -10.0])]
GOT = [np.array([[1.0, 2.0, 2.9], [1.0, 2.0, 3.0]]), np.array([10.5, -10.0])]


def _errors(metric):
    found = OutputErrors(2, metric, ["a", "b"])
    assert found.add(REF, GOT)
    return found.relative()


def test_each_metric_is_its_definition():
    a, b = REF[0] - GOT[0], REF[1] - GOT[1]
    assert _errors(Metric.REL_L2) == pytest.approx([np.linalg.norm(a) / np.linalg.norm(REF[0]),
                                                    np.linalg.norm(b) / np.linalg.norm(REF[1])])
    assert _errors(Metric.MAX_RANGE) == pytest.approx([2.0 / 2.0, 0.5 / 20.0])
    cosine = float(np.sum(REF[0] * GOT[0]) / (np.linalg.norm(REF[0]) * np.linalg.norm(GOT[0])))
    assert _errors(Metric.COSINE)[0] == pytest.approx(1 - cosine)
    assert _errors(Metric.ARGMAX) == [0.5, 0.0]  # the second row's argmax moved; b's did not


def test_a_callable_sees_every_output_per_sample_and_gives_one_error():
    seen = {}

    def top1(fp32, converted):
        seen.update(fp32=fp32, converted=converted)
        return float(np.mean([np.argmax(r) != np.argmax(g) for r, g in zip(fp32["b"], converted["b"], strict=True)]))

    found = OutputErrors(2, top1, ["a", "b"])
    found.add(REF, GOT)
    found.add(REF, [GOT[0], np.array([-10.0, 10.0])])
    assert found.relative() == [0.5, 0.5] and found.worst() == 0.5
    assert set(seen["fp32"]) == {"a", "b"} and len(seen["converted"]["b"]) == 2
    assert metric_name(top1) == "top1"


@pytest.mark.parametrize("metric", [*Metric, lambda fp32, converted: 0.0])
def test_an_output_not_finite_where_fp32_is_has_an_infinite_error(metric):
    found = OutputErrors(2, metric)
    assert not found.add(REF, [GOT[0], np.array([np.inf, 1.0])])
    assert math.isinf(found.worst())


def test_metrics_parse_by_name_and_refuse_unknown_ones():
    assert parse_metric("argmax") is Metric.ARGMAX and parse_metric(Metric.COSINE) is Metric.COSINE
    with pytest.raises(OptionError, match="unknown metric 'l1'"):
        parse_metric("l1")


def test_an_outputs_accuracy_over_samples_is_its_statistics_over_all_their_values():
    ref = [np.array([1.0, -3.0]), np.array([2.0, 5.0])]
    got = [np.array([1.5, -3.0]), np.array([2.0, 4.0])]
    found = accuracy("y", ref, got)
    r, g = np.concatenate(ref), np.concatenate(got)
    assert found.finite and found.max_abs_error == 1.0 and found.value_range == 8.0
    assert found.error_of_range == pytest.approx(1 / 8)
    assert found.rel_l2 == pytest.approx(np.linalg.norm(g - r) / np.linalg.norm(r))
    assert found.cosine == pytest.approx(r @ g / (np.linalg.norm(r) * np.linalg.norm(g)))


def test_an_output_of_one_value_is_judged_against_that_value_not_against_a_range_of_zero():
    """A scalar output (a speech probability) has no spread: its error is a share of its magnitude."""
    found = accuracy("p", [np.array([0.5])], [np.array([0.5005])])
    assert found.value_range == 0.5 and found.error_of_range == pytest.approx(1e-3)
    assert math.isinf(accuracy("z", [np.zeros(3)], [np.full(3, 1e-3)]).error_of_range)


@pytest.mark.parametrize(("ref", "got", "finite"), [
    ([1.0, np.inf], [1.0, np.inf], True),  # FP32's own inf, kept
    ([1.0, np.inf], [1.0, 65504.0], False),  # ... not kept
    ([1.0, np.nan], [1.0, np.nan], True),  # FP32's own NaN, kept
    ([1.0, np.nan], [1.0, 2.0], False),  # ... not kept
    ([1.0, -np.inf], [1.0, np.inf], False),  # an inf of the other sign
    ([1.0, np.inf], [1.0, np.nan], False),
    ([1.0, 2.0], [1.0, np.inf], False),
])
def test_an_output_is_finite_only_where_it_keeps_fp32s_values(ref, got, finite):
    found = accuracy("y", [np.array(ref)], [np.array(got)])
    assert found.finite is finite
    if not finite:
        assert found.max_abs_error == math.inf and math.isnan(found.cosine)


def test_under_the_argmax_metric_a_row_with_a_nan_never_agrees():
    """Before: numpy's argmax took FP32's NaN as the largest value, and the converted NaN at the same
    place agreed with it."""
    found = OutputErrors(1, Metric.ARGMAX)
    nan_row = np.array([[1.0, np.nan, 3.0], [3.0, 2.0, 1.0]])
    assert found.add([nan_row], [nan_row.copy()])
    assert found.relative() == [0.5]


def test_an_output_whose_last_axis_holds_one_value_has_no_argmax():
    """One logit, a scalar: no top-1 to change. Left out beside an output that has one; alone, the
    argmax metric measures nothing and says so (before: 0, a tolerance met by nothing measured)."""
    one_logit, scalar = np.array([[0.2], [0.9]]), np.array(0.5)
    found = OutputErrors(2, Metric.ARGMAX, ["p", "s"])
    found.add([one_logit, scalar], [one_logit[::-1].copy(), scalar])
    with pytest.raises(OptionError, match="the argmax metric measures none of the outputs"):
        found.relative()
    mixed = OutputErrors(2, Metric.ARGMAX, ["a", "p"])
    mixed.add([REF[0], one_logit], [GOT[0], one_logit])
    assert mixed.relative() == [0.5, 0.0]


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_nan_or_inf_where_fp32_is_finite_is_an_infinite_error_not_a_zero_one(bad):
    s = ErrorStats()
    s.add(np.array([1.0, 2.0, 3.0]), np.array([1.0, bad, 3.0]))
    assert s.max_abs == math.inf and s.rel_l2 == math.inf and s.error_of_range == math.inf
    assert s.nonfinite == 1 and not s.finite


def test_a_nan_where_fp32_has_nan_is_a_match_not_an_infinite_error():
    """A model whose FP32 outputs are NaN on some inputs (log of a negative feature) and whose converted
    model gives the same NaN there: before, NaN != NaN counted it unmatched, the error infinite and the
    output 'NaN/Inf where FP32 is finite'."""
    s = ErrorStats()
    s.add(np.array([np.nan, 2.0, -np.inf, 4.0]), np.array([np.nan, 2.5, -np.inf, 4.0]))
    assert s.finite and s.unmatched == 0 and s.nonfinite == 0
    assert s.max_abs == 0.5 and s.rel_l2 == pytest.approx(0.5 / math.sqrt(20.0))


def test_an_outputs_worst_row_is_measured_against_its_90th_percentile():
    """Rounding moves every row alike (concentration near 1); one row far beyond the rest is measured as
    such; too few rows (a classifier's one row of logits) or a single value per row give no figure."""
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((1, 128, 32))
    alike = ref + rng.uniform(-1e-3, 1e-3, ref.shape)
    one_row = alike.copy()
    one_row[0, 7] += 0.05  # one token 50x the others' error
    assert accuracy("y", [ref], [alike]).concentration < 2
    assert accuracy("y", [ref], [one_row]).concentration > 20  # relative to the rows' scales (about 2-3)
    assert accuracy("y", [ref[:, :8]], [one_row[:, :8]]).concentration is None  # 8 rows
    assert accuracy("y", [ref[..., :1]], [one_row[..., :1]]).concentration is None  # one value a row
    assert accuracy("y", [ref], [ref]).concentration is None  # exact: nothing to stand out from


def test_rows_of_other_scales_or_held_exactly_are_no_concentration():
    """Rounding is relative: rows of heavy-tailed scales (per-series forecasts) and exactly held rows (a
    segmentation map's saturated background) gave 474x and 456x by absolute error, the held-out error within
    the stated one (sweep W)."""
    rng = np.random.default_rng(0)
    scales = rng.pareto(1.0, (256, 1)) * 10 + 1
    ref = rng.standard_normal((256, 16)) * scales
    got = ref * (1 + rng.uniform(-5e-4, 5e-4, ref.shape))  # FP16-like relative rounding
    assert accuracy("y", [ref], [got]).concentration < 2
    background = np.zeros((256, 4))
    background[:, 0] = 1.0  # saturated: held exactly
    edge = rng.uniform(0.2, 0.8, (24, 4))
    probs = np.concatenate([background, edge])
    rounded = probs.copy()
    rounded[256:] *= 1 + rng.uniform(-1e-3, 1e-3, edge.shape)
    assert accuracy("p", [probs], [rounded]).concentration < 2

