"""onnxruntime's com.microsoft FusedConv (what its CPU optimizer writes for Conv + activation, with an
optional Z added first) split back into Conv, Add and the activation op: the same function, checked
against onnxruntime's own FusedConv kernel, for every activation it takes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from amp_compiler.onnx.load.fused_conv import ACTIVATION_PARAMS, split_fused_convs
from amp_compiler.onnx.measure.checks import run_onnxruntime
from tests.support.onnx_builders import model as make_model
from tests.support.onnx_builders import tensor, vi, weights

_MS = [helper.make_opsetid("com.microsoft", 1)]
_PARAMS = {"Relu": [], "Tanh": [], "Sigmoid": [], "LeakyRelu": [0.1], "Clip": [-0.5, 0.75], "HardSigmoid": [0.3, 0.4]}


def _fused(activation: str, *, z: bool, bias: bool = True, opset: int = 17) -> onnx.ModelProto:
    """x -> FusedConv(activation[, Z = z_in]) -> y, 8 channels 3x3."""
    attrs: dict = {"pads": [1, 1, 1, 1], "strides": [1, 1], "group": 1}
    if activation:
        attrs["activation"] = activation
    if _PARAMS.get(activation):
        attrs["activation_params"] = _PARAMS[activation]
    inputs = ["x", "w", "b" if bias else "", "z_in"] if z else ["x", "w", "b"]
    node = helper.make_node("FusedConv", inputs, ["y"], domain="com.microsoft", name="conv1", **attrs)
    graph_inputs = [vi("x", shape=[2, 4, 8, 8])] + ([vi("z_in", shape=[2, 8, 8, 8])] if z else [])
    inits = [tensor("w", weights((8, 4, 3, 3), 1)), tensor("b", weights((8,), 2))]
    return make_model([node], graph_inputs, [vi("y", shape=[2, 8, 8, 8])], inits, opset=opset, extra_opsets=_MS)


def _feeds(m: onnx.ModelProto) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32) * 2
            for i in m.graph.input}


@pytest.mark.parametrize("z", [False, True], ids=["conv", "conv+Z"])
@pytest.mark.parametrize("activation", sorted(ACTIVATION_PARAMS))
def test_each_activation_splits_into_the_same_function(activation, z):
    fused = _fused(activation, z=z)
    split = split_fused_convs(fused)
    onnx.checker.check_model(split.model, full_check=True)
    ops = [(n.domain, n.op_type) for n in split.model.graph.node]
    assert ops == [("", "Conv")] + ([("", "Add")] if z else []) + [("", activation)], ops
    conv = split.model.graph.node[0]
    assert conv.name == "conv1" and list(conv.input) == ["x", "w", "b"]
    assert {a.name for a in conv.attribute} == {"pads", "strides", "group"}
    assert split.split == {activation + ("+Z" if z else ""): 1}
    assert "1 com.microsoft FusedConv" in split.note
    act = split.model.graph.node[-1]
    values = {a.name: helper.get_attribute_value(a) for a in act.attribute}
    if activation == "Clip":  # min and max as inputs at opset 11 and later
        bounds = {t.name: onnx.numpy_helper.to_array(t) for t in split.model.graph.initializer}
        assert [float(bounds[n]) for n in act.input[1:]] == _PARAMS["Clip"]
        assert all(bounds[n].dtype == np.float32 for n in act.input[1:])
    else:
        assert [values[k] for k in ("alpha", "beta") if k in values] == pytest.approx(_PARAMS[activation])
    feeds = _feeds(fused)
    (want,), (got,) = run_onnxruntime(fused, feeds), run_onnxruntime(split.model, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)  # float rounding at most


def test_clip_below_opset_11_takes_its_bounds_as_attributes():
    fused = _fused("Clip", z=False, opset=10)
    split = split_fused_convs(fused)
    clip = split.model.graph.node[-1]
    assert list(clip.input) == [split.model.graph.node[0].output[0]]
    assert {a.name: a.f for a in clip.attribute} == pytest.approx({"min": -0.5, "max": 0.75})
    feeds = _feeds(fused)
    np.testing.assert_allclose(run_onnxruntime(split.model, feeds)[0], run_onnxruntime(fused, feeds)[0],
                               rtol=1e-6, atol=1e-6)


def test_z_without_bias_and_no_activation():
    fused = _fused("", z=True, bias=False)
    split = split_fused_convs(fused)
    assert [n.op_type for n in split.model.graph.node] == ["Conv", "Add"]
    assert list(split.model.graph.node[0].input) == ["x", "w"]
    assert split.model.graph.node[-1].output[0] == "y"
    feeds = _feeds(fused)
    np.testing.assert_allclose(run_onnxruntime(split.model, feeds)[0], run_onnxruntime(fused, feeds)[0],
                               rtol=1e-6, atol=1e-6)


def test_the_input_is_kept_and_a_model_without_fused_convs_is_returned_itself():
    fused = _fused("Relu", z=False)
    before = fused.SerializeToString()
    split_fused_convs(fused)
    assert fused.SerializeToString() == before
    plain = split_fused_convs(fused).model
    again = split_fused_convs(plain)
    assert again.model is plain and again.split == {} and again.note == ""


def test_a_fused_conv_onnxruntime_would_refuse_is_left_as_it_is():
    """An activation it has no kernel for, or the wrong number of parameters: the model's checks say so."""
    for activation, params in (("Elu", [1.0]), ("LeakyRelu", [])):
        node = helper.make_node("FusedConv", ["x", "w"], ["y"], domain="com.microsoft", activation=activation,
                                **({"activation_params": params} if params else {}))
        graph = helper.make_graph([node], "g", [vi("x", shape=[1, 4, 8, 8])], [vi("y")],
                                  [tensor("w", weights((8, 4, 3, 3)))])
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), *_MS])
        assert split_fused_convs(m).model is m


def test_a_name_already_taken_is_not_reused():
    fused = _fused("Clip", z=True)
    fused.graph.node.insert(0, helper.make_node("Identity", ["z_in"], ["y/conv"]))
    fused.graph.node[1].input[3] = "y/conv"
    split = split_fused_convs(fused)
    onnx.checker.check_model(split.model, full_check=True)
    outputs = [o for n in split.model.graph.node for o in n.output]
    assert len(outputs) == len(set(outputs))


def test_parameters_onnxruntime_does_not_read_are_dropped():
    node = helper.make_node("FusedConv", ["x", "w"], ["y"], domain="com.microsoft", activation="Relu",
                            activation_params=[0.5])
    graph = helper.make_graph([node], "g", [vi("x", shape=[1, 4, 8, 8])], [vi("y")],
                              [tensor("w", weights((8, 4, 3, 3)))])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), *_MS])
    assert [n.op_type for n in split_fused_convs(m).model.graph.node] == ["Conv", "Relu"]
