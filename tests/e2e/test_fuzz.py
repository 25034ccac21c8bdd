"""Fuzzing: random valid ONNX graphs (tests/support/fuzz_strategies.py) must convert, or be refused with a
clear error, into a model that passes onnx's full checker and strict shape inference, runs on
onnxruntime, keeps non-float outputs identical and float outputs within the low-precision error
bound, and converts to the same bytes a second time.

CI runs a few hundred derandomized examples; ``python -m tests.fuzz_long --examples 10000`` runs
the long campaign. Each converter bug the fuzzer found has a minimal reproduction below: an xfail
test while it is open (and the strategy avoids its pattern, ``fuzz_strategies.AVOID``, so CI stays
green), a plain regression test once fixed.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from onnx import TensorProto, helper

from amp_compiler import convert
from amp_compiler.onnx.measure.checks import run_onnxruntime, validate
from tests.support import fuzz_strategies as fz

CI_EXAMPLES = 600

_SETTINGS = settings(
    max_examples=CI_EXAMPLES,
    deadline=None,
    database=None,
    derandomize=True,  # the same examples on every CI run
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)


@_SETTINGS
@given(case=fz.fuzz_cases())
def test_random_graphs_convert_correctly(case):
    fz.check_case(case)


def test_the_strategy_covers_every_category_and_feature():
    seen: Counter = Counter()
    features: Counter = Counter()

    @settings(_SETTINGS, max_examples=400, phases=[Phase.generate])
    @given(case=fz.fuzz_cases())
    def collect(case):
        seen.update(case.ops)
        g = case.model.graph
        consumers = Counter(i for n in g.node for i in n.input)
        inits = {t.name for t in g.initializer}
        if any(consumers[t] > 1 for t in inits):
            features["shared initializer"] += 1
        if any(consumers[o.name] for o in g.output):
            features["graph output also consumed"] += 1
        if any(n.op_type in ("If", "Loop") for n in g.node):
            features["control flow"] += 1
        if any(o.type.tensor_type.elem_type in (TensorProto.INT64, TensorProto.BOOL) for o in g.output):
            features["non-float output"] += 1
        features[f"target {case.target}"] += 1
        features[f"opset {case.model.opset_import[0].version}"] += 1

    collect()
    names = {op.__name__.lstrip("_") for op in fz.OPS} - fz.AVOID
    for category, ops in fz.CATEGORIES.items():
        assert any(op.__name__.lstrip("_") in seen for op in ops), category
    assert len(names & set(seen)) >= 0.85 * len(names), sorted(names - set(seen))
    for feature in ("shared initializer", "graph output also consumed", "control flow", "non-float output",
                    "target fp16", "target bf16", *(f"opset {o}" for o in fz.OPSETS)):
        assert features[feature] > 0, feature


def test_the_tolerance_catches_a_real_precision_bug(monkeypatch):
    """The check is not vacuous: a converter that silently flushes a weight to zero is caught."""
    import amp_compiler

    real = amp_compiler.convert

    def broken(model, **kw):
        result = real(model, **kw)
        for t in result.model.graph.initializer:
            if t.data_type == TensorProto.FLOAT16 and t.dims:
                t.raw_data = bytes(len(t.raw_data))
        return result

    monkeypatch.setattr(amp_compiler, "convert", broken)
    m = helper.make_model(
        helper.make_graph(
            [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],  # K = 16: not raw-small-product
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])],
            [onnx.numpy_helper.from_array(np.full((16, 2), 0.3, np.float32), "w")],
        ),
        opset_imports=[helper.make_opsetid("", 18)],
    )
    m.ir_version = 8
    case = fz.FuzzCase(m, [fz.InputSpec("x", fz.F, (2, 16), -1.0, 1.0)], {"y": 16 * (1 * 0.3) * 4}, "fp16", 0, [])
    with pytest.raises(AssertionError, match="tolerance"):
        fz.check_case(case)


# ------------------------------------------------------------------------ bugs found by the fuzzer


def test_input_that_is_also_an_output_keeps_its_name_without_keep_io_types():
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2]),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
        [helper.make_tensor("w", TensorProto.FLOAT, [2, 2], [1, 0, 0, 1])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    out = convert(m, keep_io_types=False, probe=False).model
    validate(out)
    assert [i.name for i in out.graph.input] == ["x"]
    assert [o.name for o in out.graph.output] == ["y", "x"]
    x = np.eye(2, dtype=np.float32)
    feed = {"x": x.astype(np.float16) if out.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT16 else x}
    run_onnxruntime(out, feed)


def _model(nodes, inputs, outputs, inits=(), opset=18):
    m = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, list(inits)),
                          opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    validate(m)
    return m


_VI = helper.make_tensor_value_info
_W = onnx.numpy_helper.from_array(np.eye(2, dtype=np.float32), "w")


def test_initializer_that_is_also_a_graph_input_without_keep_io_types():
    m = _model(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        [_VI("x", TensorProto.FLOAT, [2, 2]), _VI("w", TensorProto.FLOAT, [2, 2])], [_VI("y", TensorProto.FLOAT, [2, 2])],
        [_W],
    )
    validate(convert(m, keep_io_types=False, probe=False).model)


def test_sequence_of_low_precision_tensors_into_concat_from_sequence():
    m = _model(
        [helper.make_node("MatMul", ["x", "w"], ["a"]), helper.make_node("SequenceConstruct", ["a", "a"], ["s"]),
         helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=0, new_axis=1)],
        [_VI("x", TensorProto.FLOAT, [2, 2])], [_VI("y", TensorProto.FLOAT, [2, 2, 2])], [_W],
    )
    validate(convert(m, probe=False).model)


def test_sequence_at_of_low_precision_tensors():
    one = onnx.numpy_helper.from_array(np.array(1, np.int64), "one")
    m = _model(
        [helper.make_node("MatMul", ["x", "w"], ["a"]), helper.make_node("SequenceConstruct", ["a", "a"], ["s"]),
         helper.make_node("SequenceAt", ["s", "one"], ["b"]), helper.make_node("MatMul", ["b", "w"], ["y"])],
        [_VI("x", TensorProto.FLOAT, [2, 2])], [_VI("y", TensorProto.FLOAT, [2, 2])], [_W, one],
    )
    once = convert(m, probe=False).model
    validate(once)
    assert convert(once, probe=False).model.SerializeToString() == once.SerializeToString()
    as_output = _model(
        [helper.make_node("MatMul", ["x", "w"], ["a"]), helper.make_node("SequenceConstruct", ["a", "x"], ["s"]),
         helper.make_node("SequenceAt", ["s", "one"], ["b"])],
        [_VI("x", TensorProto.FLOAT, [2, 2])], [_VI("b", TensorProto.FLOAT, [2, 2])], [_W, one],
    )
    validate(convert(as_output, probe=False).model)


@pytest.mark.xfail(
    strict=True,
    reason="found by the fuzzer: an attention mask's -1e9 rewritten to -32768 gives a fully masked row "
    "the FP32 result (uniform) only if x + -32768 is rounded to FP16 before Softmax; onnxruntime's CPU "
    "provider computes that Add in FP32 (InsertCastTransformer, then the FP32->FP16->FP32 Cast pair is "
    "removed) and returns softmax(x) for the row instead (so would any fused FP32-inside kernel)",
)
def test_fully_masked_attention_row_stays_uniform():
    rng = np.random.default_rng(0)
    m = _model(
        [helper.make_node("MatMul", ["x", "wq"], ["q"]), helper.make_node("Add", ["q", "mask"], ["s"]),
         helper.make_node("Softmax", ["s"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "wv"], ["y"])],
        [_VI("x", TensorProto.FLOAT, [2, 16])], [_VI("y", TensorProto.FLOAT, [2, 4])],  # K = 16 (raw-small-product)
        [onnx.numpy_helper.from_array(rng.standard_normal((16, 4)).astype(np.float32), "wq"),
         onnx.numpy_helper.from_array(np.array([[0, 0, 0, 0], [-1e9] * 4], np.float32), "mask"),
         onnx.numpy_helper.from_array(np.eye(4, dtype=np.float32), "wv")],
    )
    x = rng.uniform(-1, 1, (2, 16)).astype(np.float32)
    ref = run_onnxruntime(m, {"x": x})[0]
    got = run_onnxruntime(convert(m, probe=False).model, {"x": x})[0]
    np.testing.assert_allclose(ref[1], 0.25, atol=1e-6)  # the FP32 model: uniform
    np.testing.assert_allclose(got[1], ref[1], atol=1e-2)
