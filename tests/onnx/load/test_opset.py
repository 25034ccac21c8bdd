"""The opset a BF16 conversion writes at: an opset whose Conv takes no bfloat16 is raised to 22, where it
does, so that a BF16 conversion of a CNN puts its convolutions on Tensor Cores; a model the version
converter cannot raise is converted at its own opset, and the conversion says what that kept FP32."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from amp_compiler import convert
from amp_compiler.core.tensor_error import accuracy
from amp_compiler.onnx.load import opset as opset_module
from amp_compiler.onnx.load.opset import BF16_CONV_OPSET, bf16_opset, for_bf16, opset_of
from amp_compiler.onnx.measure.checks import run_onnxruntime
from amp_compiler.onnx.measure.emulate import emulate
from amp_compiler.targets import Provider
from tests.support.onnx_builders import model as make_model
from tests.support.onnx_builders import tensor, vi, weights


def _cnn(opset: int) -> onnx.ModelProto:
    """Two unnamed Convs with a Relu between, at ``opset``."""
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("Conv", ["b", "w2"], ["y"], pads=[1, 1, 1, 1])]
    inits = [tensor("w1", weights((8, 3, 3, 3), 1)), tensor("w2", weights((8, 8, 3, 3), 2, 0.1))]
    return make_model(nodes, [vi("x", shape=[1, 3, 16, 16])], [vi("y", shape=[1, 8, 16, 16])], inits, opset=opset)


def _mlp(opset: int) -> onnx.ModelProto:
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    return make_model(nodes, [vi("x", shape=[2, 8])], [vi("y", shape=[2, 8])], [tensor("w", weights((8, 8)))], opset=opset)


def test_an_opset_whose_conv_takes_no_bfloat16_is_raised_and_others_are_not():
    assert bf16_opset(_cnn(17)) == (BF16_CONV_OPSET, ("Conv",))
    assert bf16_opset(_cnn(17), Provider.CPU) is None  # onnxruntime's CPU provider has no bfloat16 Conv
    assert bf16_opset(_cnn(22)) is None  # already there
    assert bf16_opset(_mlp(17)) is None  # MatMul takes bfloat16 from opset 13
    change = for_bf16(_cnn(17))
    assert (change.before, change.after, opset_of(change.model), change.refused) == (17, 22, 22, "")
    assert change.note == "opset 17 -> 22 (bfloat16 Conv)"
    unchanged = _mlp(17)
    assert for_bf16(unchanged).model is unchanged and for_bf16(unchanged).note == ""


def test_a_bf16_conversion_of_an_opset_17_cnn_puts_its_convs_in_bf16():
    """At opset 17 both Convs kept FP32 (rule fixed: no bfloat16 in their schema): 0/2 Tensor Core ops
    low and a TF32 warning calling them kept for precision. Raised to 22: both BF16, no warning, the
    written model valid, its error a BF16 one."""
    fp32 = _cnn(17)
    result = convert(fp32, target="bf16", probe=False)
    convs = [d for d in result.decisions if d.op_type == "Conv"]
    assert [d.precision for d in convs] == ["bf16", "bf16"]
    assert result.opset_change == "opset 17 -> 22 (bfloat16 Conv)" and opset_of(result.model) == 22
    assert not any("TF32" in w for w in result.provider_warnings)
    onnx.checker.check_model(result.model, full_check=True)
    feeds = {"x": np.random.default_rng(3).uniform(-1, 1, (1, 3, 16, 16)).astype(np.float32)}
    ref, got = run_onnxruntime(fp32, feeds)[0], run_onnxruntime(emulate(result.model), feeds)[0]
    assert 0 < accuracy("y", [ref], [got]).rel_l2 < 1e-2


def test_a_model_the_converter_cannot_raise_is_converted_at_its_opset_and_says_so(monkeypatch):
    def refuse(model, version):
        raise RuntimeError("No Adapter For Conv")

    monkeypatch.setattr(opset_module.onnx.version_converter, "convert_version", refuse)
    result = convert(_cnn(17), target="bf16", probe=False)
    assert opset_of(result.model) == 17 and result.opset_change == ""
    assert [d.precision for d in result.decisions if d.op_type == "Conv"] == ["fp32", "fp32"]
    (line,) = [w for w in result.provider_warnings if "bfloat16" in w]
    assert line.startswith("2 Tensor Core op(s) keep FP32 (Conv, Conv): their schema at opset 17 takes no bfloat16")
    assert "bf16 needs opset 22 (bfloat16 Conv)" in line and "No Adapter For Conv" in line


def test_only_ops_the_provider_runs_in_bfloat16_raise_the_opset():
    """ConvTranspose and LSTM take bfloat16 from opset 22 in their schemas, but onnxruntime's CUDA provider
    has no bfloat16 kernel for them: raising the opset for them gains no Tensor Core op."""
    nodes = [helper.make_node("ConvTranspose", ["x", "w"], ["y"])]
    m = make_model(nodes, [vi("x", shape=[1, 3, 8, 8])], [vi("y", shape=[1, 4, 10, 10])],
                   [tensor("w", weights((3, 4, 3, 3)))], opset=17)
    assert bf16_opset(m) is None


@pytest.mark.parametrize("target", ["fp16", "fp8"])
def test_other_targets_keep_the_models_opset_where_they_need_no_other(target):
    fp32 = _cnn(17)
    if target == "fp8":
        samples = [{"x": np.random.default_rng(s).uniform(-1, 1, (1, 3, 16, 16)).astype(np.float32)} for s in range(2)]
        assert opset_of(convert(fp32, target=target, samples=samples).model) == 19  # float8 Q/DQ's own
    else:
        assert opset_of(convert(fp32, target=target, probe=False).model) == 17


def _with_function(op_type: str) -> onnx.ModelProto:
    """The opset-17 CNN whose Relu is a call of a model-local function computing ``op_type`` of its input."""
    function = helper.make_function("local.fn", "act", ["a"], ["b"], [helper.make_node(op_type, ["a"], ["b"])],
                                     [helper.make_opsetid("", 17)])
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("act", ["a"], ["b"], domain="local.fn"),
             helper.make_node("Conv", ["b", "w2"], ["y"], pads=[1, 1, 1, 1])]
    inits = [tensor("w1", weights((8, 3, 3, 3), 1)), tensor("w2", weights((8, 8, 3, 3), 2, 0.1))]
    return make_model(nodes, [vi("x", shape=[1, 3, 16, 16])], [vi("y", shape=[1, 8, 16, 16])], inits, opset=17,
                      extra_opsets=[helper.make_opsetid("local.fn", 1)], functions=[function])


def test_model_local_functions_are_carried_to_the_raised_opset_or_keep_it():
    """onnx's version converter drops model-local functions: the raised model lost them, and onnxruntime
    refused it ('local.fn:act is not a registered function/op'). A function whose ops kept their
    definitions (Relu: opset 14) is carried over at the new opset; one using an op redefined by then
    (Cast: opsets 19 and 21) keeps the model at its own opset, said in one warning."""
    import onnxruntime as ort

    result = convert(_with_function("Relu"), target="bf16", probe=False)
    assert opset_of(result.model) == 22 and result.model.ir_version >= 10  # opset 22 is IR version 10's
    (function,) = result.model.functions
    assert [(o.domain, o.version) for o in function.opset_import] == [("", 22)]
    onnx.checker.check_model(result.model, full_check=True)
    ort.InferenceSession(emulate(result.model).SerializeToString(), providers=["CPUExecutionProvider"])
    kept = convert(_with_function("Identity"), target="bf16", probe=False)  # Identity: redefined at 19, 21
    assert opset_of(kept.model) == 17 and len(kept.model.functions) == 1
    (line,) = [w for w in kept.provider_warnings if "bfloat16" in w]
    assert "its function local.fn.act (Identity) uses ops whose definition changed" in line


def test_raising_the_opset_keeps_the_nodes_and_graphs_metadata():
    """onnx's version converter drops ``metadata_props`` (torch.onnx's per-node source locations): a BF16
    conversion's raised model kept none, and the size line counted that as a saving (sweep Y)."""
    fp32 = _cnn(17)
    for i, node in enumerate(fp32.graph.node):
        entry = node.metadata_props.add()
        entry.key, entry.value = "pkg.torch.onnx.stack_trace", f"File model.py, line {i}"
    entry = fp32.graph.metadata_props.add()
    entry.key, entry.value = "source", "exporter"
    raised = opset_module.raise_opset(fp32, BF16_CONV_OPSET, why="bf16")
    assert opset_of(raised) == BF16_CONV_OPSET
    assert [[(p.key, p.value) for p in n.metadata_props] for n in raised.graph.node] == [
        [("pkg.torch.onnx.stack_trace", f"File model.py, line {i}")] for i in range(3)]
    assert [(p.key, p.value) for p in raised.graph.metadata_props] == [("source", "exporter")]
    written = convert(fp32, target="bf16").model
    assert sum(len(n.metadata_props) for n in written.graph.node) >= 3
