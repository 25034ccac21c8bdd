"""A model saved after onnxruntime's CPU graph optimizations (level 2, ``ORT_ENABLE_EXTENDED``, as a
session's ``optimized_model_filepath`` writes it) converts like its plain export: its Conv + activation
pairs, fused into com.microsoft FusedConv (which CUDA runs in FP32 only), are split back, so every Conv
takes FP16 on Tensor Cores, at the plain export's accuracy under exact emulation. Before, 1 of 4 did
(``provider.no-kernel``), with no word of it."""

from __future__ import annotations

import numpy as np
import onnx
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
    got = output_accuracy(optimized, result.model, samples, InProcessRunner())
    want = output_accuracy(plain, convert(plain, probe=True, runner=InProcessRunner()).model, samples,
                           InProcessRunner())
    assert all(a.finite and not misses(a) for a in got), got
    assert got[0].error_of_range <= 2 * want[0].error_of_range + 1e-4, (got, want)  # the plain export's error


def test_the_report_says_what_was_split(tmp_path):
    optimized = _ort_optimized(_convnet(), tmp_path / "convnet_ort2.onnx")
    analysis = analyze(optimized, ConvertOptions(), runner=InProcessRunner())
    assert any(w.startswith("3 com.microsoft FusedConv") for w in analysis.report.warnings), analysis.report.warnings
    names = [(n.op_type, n.precision) for n in analysis.report.nodes if n.op_type == "Conv"]
    assert names == [("Conv", "fp16")] * 4, names
