"""A model saved after onnxruntime's CPU graph optimizations (level 2, ``ORT_ENABLE_EXTENDED``, as a
session's ``optimized_model_filepath`` writes it) converts like its plain export: its Conv + activation
pairs, fused into com.microsoft FusedConv (which CUDA runs in FP32 only), and its Gemm + activation
pairs, fused into com.microsoft FusedGemm (no CUDA kernel at all), are split back, so every Conv and
Gemm takes FP16 on Tensor Cores, at the plain export's accuracy under exact emulation. Before, 1 of 4
convs did, 1 of 4 MLP Gemms, the BERT-like pooler's Gemm none (``provider.no-kernel``), with no word of it."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from amp_compiler import ConvertOptions, analyze, convert
from amp_compiler.onnx.measure.output_error import misses, output_accuracy
from amp_compiler.runtime.runner import InProcessRunner
from tests.support.onnx_builders import model as make_model
from tests.support.onnx_builders import tensor, vi, weights


def _convnet() -> onnx.ModelProto:
    """Conv+Relu, Conv+Clip(0, 6), Conv+LeakyRelu, then a 1x1 head Conv: 16x16 images, 3 -> 16 -> 16 -> 16 -> 4."""
    nodes, inits = [], [tensor("lo", np.float32(0)), tensor("hi", np.float32(6))]
    x = "image"
    for k, (act, cin) in enumerate((("Relu", 3), ("Clip", 16), ("LeakyRelu", 16))):
        inits += [tensor(f"w{k}", weights((16, cin, 3, 3), k, (2 / (9 * cin)) ** 0.5)),
                  tensor(f"b{k}", weights((16,), 10 + k, 0.1))]
        nodes.append(helper.make_node("Conv", [x, f"w{k}", f"b{k}"], [f"c{k}"], pads=[1, 1, 1, 1], name=f"conv{k}"))
        extra = {"alpha": 0.1} if act == "LeakyRelu" else {}
        nodes.append(helper.make_node(act, [f"c{k}", "lo", "hi"] if act == "Clip" else [f"c{k}"], [f"a{k}"], **extra))
        x = f"a{k}"
    inits.append(tensor("wh", weights((4, 16, 1, 1), 9, 0.25)))
    nodes.append(helper.make_node("Conv", [x, "wh"], ["logits"], name="head"))
    return make_model(nodes, [vi("image", shape=["N", 3, 16, 16])], [vi("logits", shape=["N", 4, 16, 16])], inits,
                      opset=17)


def _ort_optimized(plain: onnx.ModelProto, path) -> onnx.ModelProto:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(path)
    ort.InferenceSession(plain.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return onnx.load(str(path))


def _as_accurate_as_the_plain_export(plain, optimized, converted, samples) -> None:
    """``converted`` (of the ORT-optimized model) within the 2% line and twice the plain export's default
    conversion's error on ``samples``, under exact emulation."""
    got = output_accuracy(optimized, converted, samples, InProcessRunner())
    want = output_accuracy(plain, convert(plain, probe=True, runner=InProcessRunner()).model, samples,
                           InProcessRunner())
    assert all(a.finite and not misses(a) for a in got), got
    assert got[0].error_of_range <= 2 * want[0].error_of_range + 1e-4, (got, want)


def test_a_level_2_optimized_convnet_keeps_every_conv_in_fp16(tmp_path):
    plain = _convnet()
    optimized = _ort_optimized(plain, tmp_path / "convnet_ort2.onnx")
    assert sum(n.op_type == "FusedConv" for n in optimized.graph.node) == 3  # what onnxruntime writes

    result = convert(optimized, probe=True, runner=InProcessRunner())
    convs = [d for d in result.decisions if d.op_type in ("Conv", "FusedConv")]
    assert [(d.op_type, d.precision) for d in convs] == [("Conv", "fp16")] * 4, [(d.op_type, d.precision, d.rule)
                                                                                   for d in convs]
    assert result.fused_split.startswith("3 com.microsoft FusedConv"), result.fused_split
    assert not any(d.op_type == "FusedConv" for d in result.decisions)

    rng = np.random.default_rng(7)
    samples = [{"image": rng.uniform(0, 1, (2, 3, 16, 16)).astype(np.float32)} for _ in range(3)]
    _as_accurate_as_the_plain_export(plain, optimized, result.model, samples)


def test_the_report_says_what_was_split(tmp_path):
    optimized = _ort_optimized(_convnet(), tmp_path / "convnet_ort2.onnx")
    analysis = analyze(optimized, ConvertOptions(), runner=InProcessRunner())
    assert any(w.startswith("3 com.microsoft FusedConv") for w in analysis.report.warnings), analysis.report.warnings
    names = [(n.op_type, n.precision) for n in analysis.report.nodes if n.op_type == "Conv"]
    assert names == [("Conv", "fp16")] * 4, names


def _mlp() -> onnx.ModelProto:
    """Gemm+Relu, Gemm+Tanh, Gemm+LeakyRelu, then a head Gemm (transB): 32 -> 64 -> 64 -> 64 -> 10 features."""
    nodes, inits = [], []
    x = "features"
    for k, (act, cin) in enumerate((("Relu", 32), ("Tanh", 64), ("LeakyRelu", 64))):
        inits += [tensor(f"w{k}", weights((cin, 64), k, (2 / cin) ** 0.5)),
                  tensor(f"b{k}", weights((64,), 10 + k, 0.1))]
        nodes.append(helper.make_node("Gemm", [x, f"w{k}", f"b{k}"], [f"g{k}"], name=f"fc{k}"))
        nodes.append(helper.make_node(act, [f"g{k}"], [f"a{k}"], **({"alpha": 0.1} if act == "LeakyRelu" else {})))
        x = f"a{k}"
    inits += [tensor("wh", weights((10, 64), 9, 0.125)), tensor("bh", weights((10,), 19, 0.1))]
    nodes.append(helper.make_node("Gemm", [x, "wh", "bh"], ["logits"], transB=1, name="head"))
    return make_model(nodes, [vi("features", shape=["N", 32])], [vi("logits", shape=["N", 10])], inits, opset=17)


def _bert_like(hidden: int = 32) -> onnx.ModelProto:
    """A BERT layer's tail: LayerNorm, MatMul FFN with its residual, then the pooler (first token, Gemm +
    Tanh: what onnxruntime fuses) and a classifier Gemm."""
    h = hidden
    inits = [tensor("ln_g", np.ones(h, np.float32)), tensor("ln_b", np.zeros(h, np.float32)),
             tensor("w1", weights((h, 4 * h), 1, h ** -0.5)), tensor("b1", weights((4 * h,), 2, 0.1)),
             tensor("w2", weights((4 * h, h), 3, (4 * h) ** -0.5)), tensor("b2", weights((h,), 4, 0.1)),
             tensor("first", np.array(0, np.int64)), tensor("wp", weights((h, h), 5, h ** -0.5)),
             tensor("bp", weights((h,), 6, 0.1)), tensor("wc", weights((3, h), 7, h ** -0.5)),
             tensor("bc", weights((3,), 8, 0.1))]
    nodes = [helper.make_node("LayerNormalization", ["hidden", "ln_g", "ln_b"], ["ln"], axis=-1, epsilon=1e-12),
             helper.make_node("MatMul", ["ln", "w1"], ["m1"]), helper.make_node("Add", ["m1", "b1"], ["f1"]),
             helper.make_node("Relu", ["f1"], ["r1"]),
             helper.make_node("MatMul", ["r1", "w2"], ["m2"]), helper.make_node("Add", ["m2", "b2"], ["f2"]),
             helper.make_node("Add", ["f2", "hidden"], ["res"]),
             helper.make_node("Gather", ["res", "first"], ["cls"], axis=1),
             helper.make_node("Gemm", ["cls", "wp", "bp"], ["p"], name="pooler"),
             helper.make_node("Tanh", ["p"], ["pooled"]),
             helper.make_node("Gemm", ["pooled", "wc", "bc"], ["logits"], transB=1, name="classifier")]
    return make_model(nodes, [vi("hidden", shape=["N", 8, h])], [vi("logits", shape=["N", 3])], inits, opset=17)


@pytest.mark.parametrize(("build", "shape", "fused"), [(_mlp, (4, 32), 3), (_bert_like, (2, 8, 32), 1)],
                         ids=["mlp", "bert-like"])
def test_a_level_2_optimized_model_keeps_every_gemm_in_fp16(tmp_path, build, shape, fused):
    plain = build()
    optimized = _ort_optimized(plain, tmp_path / "ort2.onnx")
    assert sum(n.op_type == "FusedGemm" for n in optimized.graph.node) == fused  # what onnxruntime writes

    result = convert(optimized, probe=True, runner=InProcessRunner())
    gemms = [d for d in result.decisions if d.op_type in ("Gemm", "FusedGemm", "MatMul")]
    assert all(d.op_type != "FusedGemm" and d.precision == "fp16" for d in gemms), [
        (d.op_type, d.precision, d.rule) for d in gemms]
    assert sum(d.op_type == "Gemm" for d in gemms) == sum(n.op_type == "Gemm" for n in plain.graph.node)
    assert result.fused_split.startswith(f"{fused} com.microsoft FusedGemm"), result.fused_split

    rng = np.random.default_rng(7)
    name = plain.graph.input[0].name
    samples = [{name: rng.standard_normal(shape).astype(np.float32)} for _ in range(3)]
    _as_accurate_as_the_plain_export(plain, optimized, result.model, samples)


def test_the_report_says_what_gemms_were_split(tmp_path):
    optimized = _ort_optimized(_mlp(), tmp_path / "mlp_ort2.onnx")
    analysis = analyze(optimized, ConvertOptions(), runner=InProcessRunner())
    assert any(w.startswith("3 com.microsoft FusedGemm") and "exactly: 1 LeakyRelu, 1 Relu, 1 Tanh" in w
               for w in analysis.report.warnings), analysis.report.warnings
    gemms = [(n.op_type, n.precision) for n in analysis.report.nodes if "Gemm" in n.op_type]
    assert gemms == [("Gemm", "fp16")] * 4, gemms
