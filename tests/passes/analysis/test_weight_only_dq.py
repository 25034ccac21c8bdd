"""Weight-only quantization: a DequantizeLinear of a constant integer weight takes the type of the products it
feeds (the policy table's ``[[op.when]] constant_inputs`` case), its scale converted offline, so it feeds them with
no Cast between (onnxruntime's DQ -> MatMul fusion into MatMulNBits needs that); a DequantizeLinear of an
activation is untouched, an opset that types the scale ``tensor(float)`` keeps it FP32, and so does a scale FP16
holds only as subnormals (``constant.underflow``, judged value by value: passes/analysis/scale_factors.py)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from amp_compiler import convert
from amp_compiler.onnx.measure.checks import run_onnxruntime
from amp_compiler.policy import Category, default_table
from tests.support.weight_only import K, weight_only_model


def _structure(out: onnx.ModelProto) -> tuple[dict[str, onnx.NodeProto], dict[str, int]]:
    """The converted model's producers by tensor, and element types by tensor (initializers included)."""
    producers = {o: n for n in out.graph.node for o in n.output}
    inferred = onnx.shape_inference.infer_shapes(out)
    types = {v.name: v.type.tensor_type.elem_type for v in (*inferred.graph.value_info, *inferred.graph.output)}
    types.update({t.name: t.data_type for t in out.graph.initializer})
    return producers, types


def test_the_table_decides_a_dq_of_a_constant_apart_from_one_of_an_activation():
    entry = default_table().get("", "DequantizeLinear")
    no_attribute = lambda name: None  # noqa: E731
    weight = entry.resolve(no_attribute, lambda i: i == 0)
    assert weight.category is Category.FOLLOW and weight.scale_inputs == (1,) and "Weight-only" in weight.reason
    assert entry.resolve(no_attribute, lambda i: False).category is Category.NONFLOAT
    assert entry.resolve(no_attribute).category is Category.NONFLOAT
    fixed = entry.resolve(lambda name: 1 if name == "output_dtype" else None, lambda i: True)
    assert fixed.category is Category.NONFLOAT and "output_dtype" in fixed.reason


@pytest.mark.parametrize("opset", [21, 19])
@pytest.mark.parametrize("provider", ["cuda", "tensorrt"])
def test_a_weight_only_dq_feeds_its_fp16_matmul_without_a_cast(opset, provider):
    m = weight_only_model(opset)
    result = convert(m, provider=provider, probe=False)
    producers, types = _structure(result.model)
    prod = next(n for n in result.model.graph.node if n.name == "qprod")
    assert producers[prod.input[1]].op_type == "DequantizeLinear"  # no Cast between: the MatMulNBits fusion's shape
    assert types[prod.input[1]] == onnx.TensorProto.FLOAT16
    dq = producers[prod.input[1]]
    assert types[dq.input[1]] == onnx.TensorProto.FLOAT16  # the scale, converted offline
    assert not any(n.op_type == "Cast" and n.input[0] == prod.input[1] for n in result.model.graph.node)
    by_node = {d.node: d for d in result.decisions}
    assert by_node["dqw"].precision == "fp16" and by_node["qprod"].precision == "fp16"
    onnx.checker.check_model(result.model, full_check=True)
    x = np.random.default_rng(1).standard_normal((1, 16, K)).astype(np.float32)
    assert np.isfinite(run_onnxruntime(result.model, {"x": x})[0]).all()


def test_an_opset_13_dq_keeps_fp32_as_its_schema_says():
    """Before opset 19 DequantizeLinear's scale and output are tensor(float): the Cast stays."""
    result = convert(weight_only_model(13), probe=False)
    by_node = {d.node: d for d in result.decisions}
    assert by_node["dqw"].precision == "fp32" and "schema does not allow" in by_node["dqw"].reason
    producers, types = _structure(result.model)
    assert types["ws"] == onnx.TensorProto.FLOAT
    prod = next(n for n in result.model.graph.node if n.name == "qprod")
    assert producers[prod.input[1]].op_type == "Cast"


def test_a_scale_fp16_holds_only_as_subnormals_keeps_the_dq_fp32():
    """Scales of 1e-5 to 3e-5 are FP16 subnormals, rounded by up to 0.25% (FP16's own rounding: 0.049%), an error
    every weight of their block takes: nothing flushes, yet the DQ stays FP32 (constant.underflow)."""
    result = convert(weight_only_model(21, scale=1e-3), probe=False)
    by_node = {d.node: d for d in result.decisions}
    assert (by_node["dqw"].precision, by_node["dqw"].rule) == ("fp32", "constant.underflow")
    assert "quantization scale" in by_node["dqw"].reason and "'ws'" in by_node["dqw"].reason
    assert by_node["qprod"].precision == "fp16"
    _, types = _structure(result.model)
    assert types["ws"] == onnx.TensorProto.FLOAT


@pytest.mark.parametrize(("provider", "weight"), [("cuda", "fp16"), ("tensorrt", "fp32")])
def test_an_activation_dq_is_untouched(provider, weight):
    """Q -> DQ(activation) keeps the quantizer's FP32 scale; the weight's DQ follows its product: FP16 where the
    provider runs the DQs apart (CUDA), FP32 in the int8 unit TensorRT fuses (quantized.product)."""
    result = convert(weight_only_model(21, activation_dq=True), provider=provider, probe=False)
    by_node = {d.node: d for d in result.decisions}
    assert by_node["dqx"].precision == "fp32" and "Never touched" in by_node["dqx"].reason
    assert by_node["dqw"].precision == weight
    _, types = _structure(result.model)
    assert types["xs"] == onnx.TensorProto.FLOAT
