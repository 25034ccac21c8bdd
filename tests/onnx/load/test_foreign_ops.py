"""Ops onnx does not define: checked against onnxruntime's schemas instead of refused.

onnxruntime-genai's builder and onnxruntime's T5 fusion put SimplifiedLayerNormalization in onnx's
default domain, where onnx has no such op: onnx's checker refused such models ("No Op registered"),
though onnxruntime runs them. They are accepted now, checked against onnxruntime's schema (input and
output counts, attributes), while onnx's checker still checks everything else.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from amp_compiler import AmpUserError, convert
from amp_compiler.errors import ModelLoadError
from amp_compiler.onnx.load.foreign_ops import MOVED_DOMAIN, for_onnx_checker, foreign_ops
from amp_compiler.onnx.measure.checks import run_onnxruntime, validate
from tests.support.onnx_builders import F32, tensor, vi, weights


def _rms_norm_model(**attrs) -> onnx.ModelProto:
    """x -> SimplifiedLayerNormalization (default domain, as the genai builder writes it) -> MatMul -> y."""
    nodes = [
        helper.make_node("SimplifiedLayerNormalization", ["x", "gamma"], ["n"], name="norm", **attrs),
        helper.make_node("MatMul", ["n", "w"], ["y"], name="mm"),
    ]
    graph = helper.make_graph(
        nodes, "g", [vi("x", F32, [2, 8])], [vi("y", F32, [2, 8])],
        [tensor("gamma", np.ones(8, np.float32)), tensor("w", weights((8, 8)))],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    m.ir_version = 10
    return m


def test_onnx_refuses_it_and_onnxruntime_runs_it() -> None:
    m = _rms_norm_model(epsilon=1e-6, axis=-1)
    with pytest.raises(onnx.checker.ValidationError, match="No Op registered for SimplifiedLayerNormalization"):
        onnx.checker.check_model(m)
    out = run_onnxruntime(m, {"x": np.ones((2, 8), np.float32)})
    assert out[0].shape == (2, 8)


def test_converted_typed_and_valid() -> None:
    m = _rms_norm_model(epsilon=1e-6, axis=-1)
    result = convert(m, probe=False)
    by_node = {d.node: d for d in result.decisions}
    assert by_node["norm"].rule != "policy.unknown-op"
    assert by_node["mm"].precision == "fp16"
    validate(result.model, converted_from=m)
    x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    np.testing.assert_allclose(run_onnxruntime(result.model, {"x": x})[0], run_onnxruntime(m, {"x": x})[0], atol=0.05)


def test_onnxs_checker_still_checks_the_rest() -> None:
    """The op is moved out of onnx's domain for onnx's checker only: a structural fault elsewhere is
    still onnx's checker's to find."""
    m = _rms_norm_model(epsilon=1e-6)
    found = foreign_ops(m)
    assert [node.op_type for _, node, _ in found.nodes] == ["SimplifiedLayerNormalization"]
    checked = for_onnx_checker(m, found)
    assert checked.graph.node[0].domain == MOVED_DOMAIN and m.graph.node[0].domain == ""
    onnx.checker.check_model(checked)
    m.graph.node[1].input[1] = "nowhere"  # an undefined tensor
    with pytest.raises(AmpUserError, match="nowhere"):
        convert(m, probe=False)


@pytest.mark.parametrize(
    "change, needle",
    [
        (lambda n: n.attribute.append(helper.make_attribute("bogus", 1)), "unknown attribute 'bogus'"),
        (lambda n: n.input.append("x"), "3 inputs, the op takes 2"),
        (lambda n: n.attribute.append(helper.make_attribute("epsilon", "big")), "attribute 'epsilon' is STRING"),
    ],
    ids=["unknown-attribute", "too-many-inputs", "attribute-type"],
)
def test_broken_against_onnxruntimes_schema(change, needle: str) -> None:
    m = _rms_norm_model()
    change(m.graph.node[0])
    with pytest.raises(ModelLoadError, match="onnxruntime's schema of ai.onnx::SimplifiedLayerNormalization") as err:
        convert(m, probe=False)
    assert needle in str(err.value)


def test_contrib_ops_are_checked_too() -> None:
    """com.microsoft ops, which onnx's checker passes over, are checked against onnxruntime's schema."""
    node = helper.make_node("FastGelu", ["x"], ["y"], domain="com.microsoft", bogus=3)
    graph = helper.make_graph([node], "g", [vi("x", F32, [2])], [vi("y", F32, [2])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 9
    with pytest.raises(ModelLoadError, match="unknown attribute 'bogus'"):
        convert(m, probe=False)


def test_an_op_nobody_defines_in_onnxs_domain_is_still_refused() -> None:
    node = helper.make_node("NoSuchOp", ["x"], ["y"])
    graph = helper.make_graph([node], "g", [vi("x", F32, [2])], [vi("y", F32, [2])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    with pytest.raises(ModelLoadError, match="No Op registered for NoSuchOp"):
        convert(m, probe=False)
