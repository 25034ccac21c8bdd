"""Activation underflow judged by its effect (``calibration.underflow``, ``probe.underflow``): a tensor
whose flushed values weigh nothing against its own scale stays FP16, however many flush; a flushed value
on its way to an input singular at zero (a Log, a divisor) pins, however few flush."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from amp_compiler import convert
from amp_compiler.onnx.measure.calibrate import collect_ranges
from amp_compiler.onnx.measure.checks import compare, run_onnxruntime
from amp_compiler.onnx.measure.emulate import emulate
from amp_compiler.runtime.runner import InProcessRunner
from tests.support.onnx_builders import F32, model, tensor, vi

D = 32


def _columns_model(tiny_columns: int, tail: str):
    """x -> Tanh -> Mul(1e-4) -> MatMul ``mixed``: ``tiny_columns`` of its 32 output columns ~3e-9 (weights
    1e-5: representable, their products flush in FP16), the others ~3e-4; then ``tail``: "linear" (Relu,
    MatMul: what flushes stays negligible), "log" (Abs, Log: a flushed value becomes -inf) or "rsqrt"
    (Abs, Sqrt, 1 / that: a flushed value becomes inf)."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((D, D)).astype(np.float32)
    w[:, :tiny_columns] *= 1e-5
    nodes = [
        helper.make_node("Tanh", ["x"], ["feature"], name="feature"),
        helper.make_node("Mul", ["feature", "k"], ["small"], name="scale"),
        helper.make_node("MatMul", ["small", "w"], ["mixed"], name="mixed_mm"),
    ]
    inits = [tensor("w", w), tensor("k", np.array(1e-4, np.float32))]
    if tail == "linear":
        nodes += [helper.make_node("Relu", ["mixed"], ["act"], name="relu"),
                  helper.make_node("MatMul", ["act", "w2"], ["out"], name="head_mm")]
        inits.append(tensor("w2", (rng.standard_normal((D, D)) * 1e3).astype(np.float32)))
    elif tail == "log":
        nodes += [helper.make_node("Abs", ["mixed"], ["mag"], name="abs"),
                  helper.make_node("Log", ["mag"], ["out"], name="log")]
    else:  # an inverse square root, as a hand-written norm divides by one
        nodes += [helper.make_node("Abs", ["mixed"], ["mag"], name="abs"),
                  helper.make_node("Sqrt", ["mag"], ["root"], name="sqrt"),
                  helper.make_node("Div", ["one", "root"], ["out"], name="div")]
        inits.append(tensor("one", np.array(1.0, np.float32)))
    return model(nodes, [vi("x", F32, [8, D])], [vi("out", F32, [8, D])], inits)


def _samples(n=3):
    return [{"x": np.random.default_rng(20 + i).standard_normal((8, D)).astype(np.float32)} for i in range(n)]


def _accuracy(m, converted, sample):
    return compare("out", run_onnxruntime(m, sample)[0], run_onnxruntime(emulate(converted), sample)[0])


def test_flush_below_fp16_rounding_stays_fp16():
    """Half of ``mixed``'s values flush (the old rule, more than 25% flushed, pinned both MatMuls), but
    they move it by 1e-5 of its L2 norm, 0.02 of FP16's own rounding: no pin, the same accuracy."""
    m = _columns_model(D // 2, "linear")
    samples = _samples()
    ranges = collect_ranges(m, samples, runner=InProcessRunner())
    r = ranges["mixed"]
    assert r.underflow_share > 0.45 and 0 < r.underflow_error < 2.0**-11 / 10
    result = convert(m, ranges=ranges, probe=False)
    d = {x.node: x for x in result.decisions}
    assert d["mixed_mm"].precision == d["head_mm"].precision == "fp16", (d["mixed_mm"].reason, d["head_mm"].reason)
    acc = _accuracy(m, result.model, samples[0])
    assert acc.finite and acc.cosine > 0.9999 and acc.error_of_range < 0.01


def test_whole_tensor_flushing_pins():
    """Every value of ``mixed`` flushes: it moves by its whole norm, 2048 times FP16's rounding."""
    m = _columns_model(D, "linear")
    result = convert(m, ranges=collect_ranges(m, _samples(), runner=InProcessRunner()), probe=False)
    d = {x.node: x for x in result.decisions}
    assert d["mixed_mm"].rule == "calibration.underflow"
    assert "FP32 saves that error" in d["mixed_mm"].reason


@pytest.mark.parametrize(("tail", "sink"), [("log", "input 0 of Log node 'log'"),
                                            ("rsqrt", "input 1 of Div node 'div'")])
@pytest.mark.parametrize("probe", [False, True])
def test_few_flushed_values_into_a_singular_input_pin(probe, tail, sink):
    """An eighth of ``mixed`` flushes (below the old rule's 25%, and far below FP16's rounding against
    its norm), but Abs (and Sqrt) keep zeros and Log(0), 1/0 are infinite: the producer and the way
    to the singular input stay FP32."""
    m = _columns_model(D // 8, tail)
    samples = _samples()
    if probe:
        result = convert(m, probe=True, runner=InProcessRunner())
        rule = "probe.underflow"
    else:
        ranges = collect_ranges(m, samples, runner=InProcessRunner())
        assert ranges["mixed"].underflow_share < 0.25 and ranges["mixed"].underflow_error < 2.0**-11
        result = convert(m, ranges=ranges, probe=False)
        rule = "calibration.underflow"
    d = {x.node: x for x in result.decisions}
    assert d["mixed_mm"].rule == d["abs"].rule == rule, (d["mixed_mm"].rule, d["abs"].rule)
    assert f"{sink} is singular at zero" in d["mixed_mm"].reason
    if tail == "rsqrt":
        assert d["sqrt"].precision == d["div"].precision == "fp32"
    assert _accuracy(m, result.model, samples[0]).finite


def test_a_nonnegative_constant_exponent_is_not_singular():
    """Pow(x, 2) of a flushed value is 0, as in FP32 nearly: only a negative exponent is singular at zero."""
    m = _columns_model(D // 8, "log")
    for node in m.graph.node:
        if node.name == "log":
            node.op_type, node.name = "Pow", "pow"
            node.input.append("two")
    m.graph.initializer.append(tensor("two", np.array(2.0, np.float32)))
    result = convert(m, ranges=collect_ranges(m, _samples(), runner=InProcessRunner()), probe=False)
    d = {x.node: x for x in result.decisions}
    assert d["mixed_mm"].precision == "fp16", d["mixed_mm"].reason
