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
    assert bf16_opset(_cnn(17)) == BF16_CONV_OPSET
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


@pytest.mark.parametrize("target", ["fp16", "fp8"])
def test_other_targets_keep_the_models_opset_where_they_need_no_other(target):
    fp32 = _cnn(17)
    if target == "fp8":
        samples = [{"x": np.random.default_rng(s).uniform(-1, 1, (1, 3, 16, 16)).astype(np.float32)} for s in range(2)]
        assert opset_of(convert(fp32, target=target, samples=samples).model) == 19  # float8 Q/DQ's own
    else:
        assert opset_of(convert(fp32, target=target, probe=False).model) == 17
