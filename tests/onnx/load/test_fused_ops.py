"""onnxruntime's com.microsoft FusedConv (what its CPU optimizer writes for Conv + activation, with an
optional Z added first) split back into Conv, Add and the activation op, and its FusedGemm (Gemm +
activation) into Gemm and the activation op: the same function, checked against onnxruntime's own
fused kernels, for every activation they take that a standard op is."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from amp_compiler.onnx.load.fused_ops import ACTIVATION_PARAMS, GEMM_ACTIVATION_PARAMS, split_fused_ops
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
    split = split_fused_ops(fused)
    onnx.checker.check_model(split.model, full_check=True)
    ops = [(n.domain, n.op_type) for n in split.model.graph.node]
    assert ops == [("", "Conv")] + ([("", "Add")] if z else []) + [("", activation)], ops
    conv = split.model.graph.node[0]
    assert conv.name == "conv1" and list(conv.input) == ["x", "w", "b"]
    assert {a.name for a in conv.attribute} == {"pads", "strides", "group"}
    assert split.split == {"FusedConv": {activation + ("+Z" if z else ""): 1}}
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
    split = split_fused_ops(fused)
    clip = split.model.graph.node[-1]
    assert list(clip.input) == [split.model.graph.node[0].output[0]]
    assert {a.name: a.f for a in clip.attribute} == pytest.approx({"min": -0.5, "max": 0.75})
    feeds = _feeds(fused)
    np.testing.assert_allclose(run_onnxruntime(split.model, feeds)[0], run_onnxruntime(fused, feeds)[0],
                               rtol=1e-6, atol=1e-6)


def test_z_without_bias_and_no_activation():
    fused = _fused("", z=True, bias=False)
    split = split_fused_ops(fused)
    assert [n.op_type for n in split.model.graph.node] == ["Conv", "Add"]
    assert list(split.model.graph.node[0].input) == ["x", "w"]
    assert split.model.graph.node[-1].output[0] == "y"
    feeds = _feeds(fused)
    np.testing.assert_allclose(run_onnxruntime(split.model, feeds)[0], run_onnxruntime(fused, feeds)[0],
                               rtol=1e-6, atol=1e-6)


def test_the_input_is_kept_and_a_model_without_fused_convs_is_returned_itself():
    fused = _fused("Relu", z=False)
    before = fused.SerializeToString()
    split_fused_ops(fused)
    assert fused.SerializeToString() == before
    plain = split_fused_ops(fused).model
    again = split_fused_ops(plain)
    assert again.model is plain and again.split == {} and again.note == ""


def test_a_fused_conv_onnxruntime_would_refuse_is_left_as_it_is():
    """An activation it has no kernel for, or the wrong number of parameters: the model's checks say so."""
    for activation, params in (("Elu", [1.0]), ("LeakyRelu", [])):
        node = helper.make_node("FusedConv", ["x", "w"], ["y"], domain="com.microsoft", activation=activation,
                                **({"activation_params": params} if params else {}))
        graph = helper.make_graph([node], "g", [vi("x", shape=[1, 4, 8, 8])], [vi("y")],
                                  [tensor("w", weights((8, 4, 3, 3)))])
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), *_MS])
        assert split_fused_ops(m).model is m


def test_a_name_already_taken_is_not_reused():
    fused = _fused("Clip", z=True)
    fused.graph.node.insert(0, helper.make_node("Identity", ["z_in"], ["y/conv"]))
    fused.graph.node[1].input[3] = "y/conv"
    split = split_fused_ops(fused)
    onnx.checker.check_model(split.model, full_check=True)
    outputs = [o for n in split.model.graph.node for o in n.output]
    assert len(outputs) == len(set(outputs))


def test_parameters_onnxruntime_does_not_read_are_dropped():
    node = helper.make_node("FusedConv", ["x", "w"], ["y"], domain="com.microsoft", activation="Relu",
                            activation_params=[0.5])
    graph = helper.make_graph([node], "g", [vi("x", shape=[1, 4, 8, 8])], [vi("y")],
                              [tensor("w", weights((8, 4, 3, 3)))])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), *_MS])
    assert [n.op_type for n in split_fused_ops(m).model.graph.node] == ["Conv", "Relu"]


# FusedGemm: what onnxruntime's GemmActivationFusion writes, the activation's attributes as activation_<name>
_GEMM_PARAMS = {"LeakyRelu": {"alpha": 0.1}, "Elu": {"alpha": 0.7}, "ThresholdedRelu": {"alpha": 0.4},
                "HardSigmoid": {"alpha": 0.3, "beta": 0.4}, "Selu": {"alpha": 1.5, "gamma": 1.2}}


def _fused_gemm(activation: str, *, c: bool = True, opset: int = 17, **gemm) -> onnx.ModelProto:
    """a -> FusedGemm(activation, alpha 0.5, beta 2, transB 1) -> y, [3, 8] x [6, 8]^T (+ c [6])."""
    attrs = {"alpha": 0.5, "beta": 2.0, "transB": 1, **gemm, "activation": activation}
    attrs.update({f"activation_{k}": v for k, v in _GEMM_PARAMS.get(activation, {}).items()})
    node = helper.make_node("FusedGemm", ["a", "w", "c"] if c else ["a", "w"], ["y"], domain="com.microsoft",
                            name="fc1", **attrs)
    inits = [tensor("w", weights((6, 8), 1)), tensor("c", weights((6,), 2))]
    return make_model([node], [vi("a", shape=[3, 8])], [vi("y", shape=[3, 6])], inits, opset=opset, extra_opsets=_MS)


@pytest.mark.parametrize("activation", sorted(GEMM_ACTIVATION_PARAMS))
def test_each_fused_gemm_activation_splits_into_the_same_function(activation):
    fused = _fused_gemm(activation)
    split = split_fused_ops(fused)
    onnx.checker.check_model(split.model, full_check=True)
    gemm, act = split.model.graph.node
    assert [(n.domain, n.op_type) for n in (gemm, act)] == [("", "Gemm"), ("", activation)]
    assert gemm.name == "fc1" and list(gemm.input) == ["a", "w", "c"] and act.output[0] == "y"
    assert {a.name: helper.get_attribute_value(a) for a in gemm.attribute} == {"alpha": 0.5, "beta": 2.0, "transB": 1}
    values = {a.name: helper.get_attribute_value(a) for a in act.attribute}
    assert values == pytest.approx(_GEMM_PARAMS.get(activation, {}))
    assert split.split == {"FusedGemm": {activation: 1}}
    assert split.note.startswith("1 com.microsoft FusedGemm") and "split into Gemm + activation" in split.note
    feeds = _feeds(fused)
    (want,), (got,) = run_onnxruntime(fused, feeds), run_onnxruntime(split.model, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)  # float rounding at most


def test_a_fused_gemm_without_c_and_transposed_a():
    fused = _fused_gemm("Relu", c=False, transA=1, transB=0)
    fused.graph.input[0].CopyFrom(vi("a", shape=[8, 3]))
    fused.graph.node[0].input[1] = "w_t"
    fused.graph.initializer.append(tensor("w_t", weights((8, 6), 3)))
    split = split_fused_ops(fused)
    assert [n.op_type for n in split.model.graph.node] == ["Gemm", "Relu"]
    assert list(split.model.graph.node[0].input) == ["a", "w_t"]
    assert {a.name: a.i for a in split.model.graph.node[0].attribute if a.name.startswith("trans")} == {
        "transA": 1, "transB": 0}
    feeds = _feeds(fused)
    np.testing.assert_allclose(run_onnxruntime(split.model, feeds)[0], run_onnxruntime(fused, feeds)[0],
                               rtol=1e-6, atol=1e-6)


def test_fused_convs_and_gemms_are_both_in_the_note():
    conv = _fused("Relu", z=False)
    gemm = _fused_gemm("Tanh")
    conv.graph.node.extend(gemm.graph.node)
    conv.graph.input.extend(gemm.graph.input)
    conv.graph.output.extend(gemm.graph.output)
    conv.graph.initializer.extend(t for t in gemm.graph.initializer if t.name != "w" and t.name != "c")
    conv.graph.node[1].input[1:] = ["w_fc", "c_fc"]
    conv.graph.initializer.extend([tensor("w_fc", weights((6, 8), 1)), tensor("c_fc", weights((6,), 2))])
    split = split_fused_ops(conv)
    assert [n.op_type for n in split.model.graph.node] == ["Conv", "Relu", "Gemm", "Tanh"]
    assert split.split == {"FusedConv": {"Relu": 1}, "FusedGemm": {"Tanh": 1}}
    assert split.note.startswith("1 com.microsoft FusedConv") and ". 1 com.microsoft FusedGemm" in split.note


def test_a_fused_gemm_no_standard_op_is_or_onnxruntime_would_refuse_is_left_as_it_is():
    """ScaledTanh (of onnxruntime's experimental set), a parameter its kernel needs missing, no activation,
    or no C below opset 11 (where Gemm needs one)."""
    cases = [_fused_gemm("Relu", c=False, opset=10)]
    for activation, params in (("ScaledTanh", {"activation_alpha": 1.0, "activation_beta": 1.0}),
                               ("LeakyRelu", {}), ("Selu", {"activation_alpha": 1.5}), ("", {})):
        node = helper.make_node("FusedGemm", ["a", "w", "c"], ["y"], domain="com.microsoft",
                                **({"activation": activation} if activation else {}), **params)
        graph = helper.make_graph([node], "g", [vi("a", shape=[3, 8])], [vi("y")],
                                  [tensor("w", weights((8, 6))), tensor("c", weights((6,)))])
        cases.append(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), *_MS]))
    for m in cases:
        assert split_fused_ops(m).model is m


def test_a_fused_op_the_user_blocks_is_left_fused_and_fp32():
    """--block-op FusedConv keeps the fused node (FP32, as blocked): split first, its Conv matched no block
    and went FP16."""
    from amp_compiler import convert

    fused = _fused("Relu", z=False)
    assert split_fused_ops(fused, kept={"FusedConv"}).model is fused
    result = convert(fused, block_ops=["FusedConv"], probe=False)
    assert [(d.op_type, d.precision) for d in result.decisions if d.node == "conv1"] == [("FusedConv", "fp32")]
    assert not result.fused_split
    assert [d.op_type for d in convert(fused, probe=False).decisions if d.node == "conv1"] == ["Conv"]
