"""Signal paths (passes/analysis/signal.py): the linear path from a raw graph input into a Log stays FP32
(``policy.high.signal-path``), through a Cast between float types too (core/graph.dataflow)."""

from __future__ import annotations

import pytest
from onnx import TensorProto, helper

from amp_compiler import convert
from tests.support.onnx_builders import F32, model, tensor, vi, weights


@pytest.mark.parametrize("cast", [False, True], ids=["input", "cast-input"])
def test_filter_bank_into_log_stays_fp32_through_a_float_cast(cast):
    """A Cast(to=FLOAT) of the samples (``wave.float()`` as exported) has its input and output in two
    vertices, with no tensor between them: the walk back from the Log stopped at its output."""
    first = [helper.make_node("Cast", ["audio"], ["a32"], name="cast", to=TensorProto.FLOAT)] if cast else []
    m = model(
        first + [helper.make_node("MatMul", ["a32" if cast else "audio", "filters"], ["spec"], name="filterbank"),
                 helper.make_node("Abs", ["spec"], ["mag"], name="abs"),
                 helper.make_node("Log", ["mag"], ["l"], name="log"),
                 helper.make_node("MatMul", ["l", "W"], ["y"], name="head")],
        [vi("audio", F32, [1, 64])], [vi("y", F32, [1, 8])],
        [tensor("filters", weights((64, 16))), tensor("W", weights((16, 8), seed=3))],
    )
    d = {x.node: (x.precision, x.rule) for x in convert(m, probe=False).decisions}
    assert d["filterbank"] == d["abs"] == ("fp32", "policy.high.signal-path"), d
    assert d["head"] == ("fp16", "policy.low")
