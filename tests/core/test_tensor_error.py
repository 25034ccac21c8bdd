"""The error metrics of a run's outputs (OutputErrors): relative L2 as before, max error of range,
1 - cosine, argmax changes, and the user's callable, each infinite where an output is not finite
where FP32 is."""

from __future__ import annotations

import math

import numpy as np
import pytest

from amp_compiler.core.tensor_error import Metric, OutputErrors, metric_name, parse_metric
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
