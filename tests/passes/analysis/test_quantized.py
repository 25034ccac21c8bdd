"""DequantizeLinear -> product units (``quantized.product``): a static int8 QDQ Conv or MatMul whose output is not
quantized again keeps its DQ outputs feeding it directly, in their FP32, on the providers that fuse the unit into
an int8 kernel (TensorRT: Conv and MatMul; onnxruntime's CPU provider: MatMul), while a plain product beside it
goes FP16; where the provider runs the DQs and a float product apart, the product goes FP16 and says why."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from amp_compiler import convert
from amp_compiler.onnx.measure.checks import run_onnxruntime
from tests.support.onnx_builders import F32, tensor, vi
from tests.support.onnx_builders import model as make_model

_RNG = np.random.default_rng(7)


def _qdq_model(kind: str) -> onnx.ModelProto:
    """DQ(activation) + DQ(int8 weight) -> ``kind`` ("Conv" or "MatMul", node "qprod") -> Relu, then a plain FP32
    ``kind`` ("plain"): no QuantizeLinear after the quantized product."""
    if kind == "Conv":
        shape, w_shape, axis, w2_shape, y_shape = [1, 8, 8, 8], (16, 8, 3, 3), 0, (16, 16, 3, 3), [1, 16, 8, 8]
        attrs = {"pads": [1, 1, 1, 1]}
    else:
        shape, w_shape, axis, w2_shape, y_shape = [4, 16], (16, 16), 1, (16, 16), [4, 16]
        attrs = {}
    channels = w_shape[axis]
    w_scale = _RNG.uniform(0.002, 0.004, channels).astype(np.float32)
    wq = np.clip(np.round(_RNG.standard_normal(w_shape) * 40), -127, 127).astype(np.int8)
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"], name="qx"),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"], name="dqx"),
        helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], name="dqw", axis=axis),
        helper.make_node(kind, ["xd", "wd"], ["p"], name="qprod", **attrs),
        helper.make_node("Relu", ["p"], ["r"], name="relu"),
        helper.make_node(kind, ["r", "w2"], ["y"], name="plain", **attrs),
    ]
    inits = [tensor("xs", np.array(0.02, np.float32)), tensor("xz", np.array(0, np.int8)),
             tensor("wq", wq), tensor("ws", w_scale), tensor("wz", np.zeros(channels, np.int8)),
             tensor("w2", (_RNG.standard_normal(w2_shape) * 0.05).astype(np.float32))]
    m = make_model(nodes, [vi("x", F32, shape)], [vi("y", F32, y_shape)], inits, opset=17)
    onnx.checker.check_model(m, full_check=True)
    return m


def _feeds(m: onnx.ModelProto) -> dict[str, np.ndarray]:
    shape = [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
    return {"x": _RNG.uniform(-1, 1, shape).astype(np.float32)}


@pytest.mark.parametrize(("provider", "kind"), [("tensorrt", "Conv"), ("tensorrt", "MatMul"), ("cpu", "MatMul")])
def test_a_fused_dq_product_unit_keeps_its_dequantized_operands_without_a_cast(provider, kind):
    m = _qdq_model(kind)
    result = convert(m, provider=provider, probe=False)
    out = result.model
    producers = {o: n for n in out.graph.node for o in n.output}
    prod = next(n for n in out.graph.node if n.name == "qprod")
    assert [producers[i].op_type for i in prod.input[:2]] == ["DequantizeLinear", "DequantizeLinear"]
    inferred = onnx.shape_inference.infer_shapes(out)
    types = {v.name: v.type.tensor_type.elem_type for v in (*inferred.graph.value_info, *inferred.graph.output)}
    assert {types[t] for t in (*prod.input[:2], *prod.output)} == {onnx.TensorProto.FLOAT}  # the DQs' type
    by_node = {d.node: d for d in result.decisions}
    assert (by_node["qprod"].precision, by_node["qprod"].rule) == ("fp32", "quantized.product")
    assert f"int8 on {provider}" in by_node["qprod"].reason and "'dqx'" in by_node["qprod"].reason
    assert by_node["plain"].precision == "fp16"
    onnx.checker.check_model(out, full_check=True)
    got = run_onnxruntime(out, _feeds(m))[0]
    assert np.isfinite(got).all()
    assert not any("TF32" in w and "qprod" in w for w in result.provider_warnings)  # int8: TF32 has no say


@pytest.mark.parametrize(("provider", "kind", "why"), [
    ("cuda", "Conv", "CUDA provider fuses no DequantizeLinear"),
    ("cuda", "MatMul", "CUDA provider fuses no DequantizeLinear"),
    ("cpu", "Conv", "QLinearConv only with a QuantizeLinear after the Conv"),
])
def test_an_unfused_dq_product_unit_goes_fp16_and_says_why(provider, kind, why):
    result = convert(_qdq_model(kind), provider=provider, probe=False)
    by_node = {d.node: d for d in result.decisions}
    assert by_node["qprod"].precision == "fp16" and by_node["qprod"].rule != "quantized.product"
    assert why in by_node["qprod"].reason and "'dqx'" in by_node["qprod"].reason


def test_a_weight_only_dq_is_no_unit():
    """DequantizeLinear on the weight alone: every provider computes the product in float (TensorRT as a
    dequantizing prologue into a GEMM in the activation's precision), so it goes FP16 as any other."""
    m = _qdq_model("MatMul")
    prod = next(n for n in m.graph.node if n.name == "qprod")
    prod.input[0] = "x"
    result = convert(m, provider="tensorrt", probe=False)
    by_node = {d.node: d for d in result.decisions}
    assert (by_node["qprod"].precision, by_node["qprod"].rule) == ("fp16", "policy.low")


def test_tensorrt_prefers_the_unit_to_the_requantize_rule_with_a_quantizer_after_it():
    """DQ -> MatMul -> QuantizeLinear: one int8 unit on TensorRT (quantized.product), FP32 for the quantizer on
    onnxruntime's CUDA provider (quantized.requantize), which runs the DQs and the product apart."""
    m = _qdq_model("MatMul")
    del m.graph.node[4:]
    m.graph.node.append(helper.make_node("QuantizeLinear", ["p", "xs", "xz"], ["y"], name="qy"))
    m.graph.output[0].type.tensor_type.elem_type = onnx.TensorProto.INT8
    rules = {p: {d.node: d.rule for d in convert(m, provider=p, probe=False).decisions} for p in ("tensorrt", "cuda")}
    assert rules["tensorrt"]["qprod"] == "quantized.product" and rules["cuda"]["qprod"] == "quantized.requantize"


def test_the_summary_line_counts_fused_units_as_int8(tmp_path, capsys):
    from amp_compiler.cli import main

    onnx.save(_qdq_model("Conv"), tmp_path / "m.onnx")
    assert main(["convert", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o.onnx"), "--provider", "tensorrt",
                 "--no-probe"]) == 0
    assert "Tensor Core ops in fp16: 1/1, int8 (QDQ, run by the provider): 1 |" in capsys.readouterr().out
