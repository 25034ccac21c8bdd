"""--target fp8 on deployment graphs (onnxruntime's transformer optimizer, onnxruntime-genai's builder):
the plain MatMuls go FP8, the fused com.microsoft Tensor Core ops stay in the fallback precision with
rule fp8.no-qdq and the policy table's reason, and count in the FP8 share's denominator."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import pytest

from amp_compiler.core.plan import Rule
from amp_compiler.onnx.fp8.steps import fp8_flop_share
from amp_compiler.onnx.load.opset import raise_opset
from amp_compiler.onnx.measure.chain import exposed_model
from amp_compiler.onnx.measure.checks import compare
from amp_compiler.onnx.measure.emulate import emulate
from amp_compiler.policy import default_table
from models import catalog
from models.deployment import feeds_for
from tests.support.fp8_builders import session, to_fp8

FUSED = {"Attention", "MultiHeadAttention", "GroupQueryAttention", "MatMulNBits"}


def _converted(name: str):
    entry, model = catalog.get(name), catalog.load(name)
    samples = [feeds_for(model, entry.make_inputs(np.random.default_rng(seed))) for seed in range(1, 4)]
    return entry, model, to_fp8(model, samples)


@pytest.mark.parametrize("name", ["bert-fused-small", "llama-genai-fp32-small", "llama-genai-int4-small"])
def test_fused_ops_stay_in_the_fallback_with_their_reason_and_plain_matmuls_go_fp8(name):
    entry, model, result = _converted(name)
    fused = [d for d in result.decisions if d.op_type in FUSED]
    assert fused
    for d in fused:
        assert (d.precision, d.rule) == ("fp16", Rule.FP8_NO_QDQ.value), d
        assert d.reason == default_table().get("com.microsoft", d.op_type).fp8_reason
        assert "Q/DQ" in d.reason and "no float8" in d.reason
    matmuls = [d for d in result.decisions if d.op_type in ("MatMul", "Gemm")]
    assert all(d.rule in (Rule.FP8_GEMM.value, Rule.FP8_KEPT.value) for d in matmuls), matmuls
    share = fp8_flop_share(result)
    if matmuls:  # the fused ops' FLOPs are in the denominator: the share is below 1
        assert any(d.rule == Rule.FP8_GEMM.value for d in matmuls)
        assert 0 < share < 1
    else:  # int4 decoder: every GEMM is a MatMulNBits
        assert share == 0
    held_out = feeds_for(model, entry.make_inputs(np.random.default_rng(100)))
    reference = session(model).run(None, held_out)
    got = session(emulate(result.model)).run(None, held_out)
    for info, ref, out in zip(model.graph.output, reference, got, strict=True):
        if np.issubdtype(ref.dtype, np.floating) and ref.size:
            acc = compare(info.name, ref, out)
            assert acc.finite and acc.cosine >= 0.99, (info.name, acc)


def test_calibration_exposes_tensors_after_contrib_ops():
    model = catalog.load("bert-fused-small")
    inferred = onnx.shape_inference.infer_shapes(model)
    typed = {vi.name for vi in inferred.graph.value_info}
    _, names = exposed_model(model)
    after = [o for n in model.graph.node if n.op_type == "SkipLayerNormalization" for o in n.output[:1]]
    assert after and not set(after) & typed  # onnx's inference cannot type them
    assert set(after) <= set(names)  # the ops' schemas do


def test_opset_raise_sets_undefined_default_domain_ops_aside():
    """onnxruntime's SimplifiedLayerNormalization lives in the default domain, where onnx's version
    converter has no schema for it and stops; it is set aside while the converter runs."""
    x = oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 8])
    y = oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 8])
    graph = oh.make_graph(
        [oh.make_node("SimplifiedLayerNormalization", ["x", "g"], ["n"], axis=-1, epsilon=1e-6),
         oh.make_node("Reshape", ["n", "shape"], ["y"])],
        "g", [x], [y],
        [onnx.numpy_helper.from_array(np.ones(8, np.float32), "g"),
         onnx.numpy_helper.from_array(np.array([2, 8], np.int64), "shape")],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 13)], ir_version=8)
    raised = raise_opset(model)
    assert [(o.domain, o.version) for o in raised.opset_import] == [("", 19)]
    assert [(n.domain, n.op_type) for n in raised.graph.node] == [("", "SimplifiedLayerNormalization"),
                                                                ("", "Reshape")]
    assert raised.ir_version >= 9
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 13)]  # the input is untouched
    got = session(raised).run(None, {"x": np.ones((2, 8), np.float32)})[0]
    assert got.shape == (2, 8)


def test_fused_t5_encoder_converts_to_fp8():
    _, _, result = _converted("t5-encoder-fused-small")
    assert next(o.version for o in result.model.opset_import if o.domain in ("", "ai.onnx")) >= 19
    assert sum(d.rule == Rule.FP8_GEMM.value for d in result.decisions) > 0


def test_the_fp8_share_is_costed_at_the_calibration_datas_sizes():
    """A projection in FP8 (FLOPs linear in the sequence) and an attention product the user keeps FP32 (quadratic):
    at the data's 64 tokens they weigh alike, at 1 token the projection is nearly all. The summary
    costed it at 1 (dynamic dims taken as 1) where --tolerance costs at the data's sizes: T5's 12%
    against 14.4%."""
    from amp_compiler import convert

    rng = np.random.default_rng(0)
    w = oh.make_tensor("w", onnx.TensorProto.FLOAT, [64, 64], (rng.standard_normal((64, 64)) * 0.1).astype(np.float32).ravel())
    nodes = [oh.make_node("MatMul", ["x", "w"], ["h"], name="proj"),
             oh.make_node("Transpose", ["h"], ["ht"], name="t", perm=[0, 2, 1]),
             oh.make_node("MatMul", ["h", "ht"], ["y"], name="scores")]
    graph = oh.make_graph(nodes, "g", [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["b", "s", 64])],
                          [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["b", "s", "s"])], [w])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 19)])
    samples = [{"x": rng.standard_normal((1, 64, 64)).astype(np.float32)} for _ in range(2)]
    result = convert(model, target="fp8", samples=samples, block_nodes=("^scores$",))
    assert [d.precision for d in result.decisions if d.op_type == "MatMul"] == ["fp8", "fp32"]
    assert result.sample_shapes == {"x": (1, 64, 64)}
    assert fp8_flop_share(result) == pytest.approx(0.5)
