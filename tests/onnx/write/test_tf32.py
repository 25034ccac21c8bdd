"""The TF32 warning: Tensor Core ops kept in FP32 for their precision, on providers that read them as TF32."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from amp_compiler import convert
from amp_compiler.core.tensor_error import accuracy
from amp_compiler.onnx.measure.checks import run_onnxruntime
from amp_compiler.onnx.measure.emulate import emulate
from models import catalog
from tests.support.onnx_builders import F32, tensor, vi
from tests.support.onnx_builders import model as make_model

_SIGNAL_PATH = ("cqt_0", "downsample", "cqt_1")  # cqt-log's Convs on the audio's linear path into a Log


@pytest.mark.parametrize("provider", ["cuda", "tensorrt"])
def test_products_kept_fp32_for_precision_are_named_with_the_remedy(provider):
    (line,) = convert(catalog.load("cqt-log"), provider=provider).provider_warnings
    assert line.startswith("3 matrix products kept in FP32 for precision (cqt_0, downsample, cqt_1: "
                           "policy.high.signal-path) run as TF32")
    assert "use_tf32=0" in line and "BuilderFlag.TF32" in line and "compare --tf32" in line


def test_more_than_three_are_counted_and_the_cpu_gets_no_warning():
    fp32 = catalog.load("quantized-encoder")
    lines = [w for w in convert(fp32, provider="cuda").provider_warnings if "TF32" in w]
    assert len(lines) == 1 and lines[0].startswith("4 matrix products") and "and 1 more: quantized.requantize" in lines[0]
    assert convert(fp32, provider="cpu").provider_warnings == []


def test_a_user_blocked_product_is_warned_of_a_range_pinned_one_is_not():
    """TF32 keeps FP32's range: a product kept FP32 for its range loses nothing to it, one the user
    keeps FP32 (for its precision) does."""
    fp32 = catalog.load("mlp-softmax")
    first = next(n.name for n in fp32.graph.node if n.op_type in ("MatMul", "Gemm"))
    (line,) = convert(fp32, provider="cuda", block_nodes=(f"^{first}$",), probe=False).provider_warnings
    assert line.startswith(f"1 matrix product kept in FP32 for precision ({first}: ")
    decoder = catalog.load("llama-massive-activations-small")
    result = convert(decoder, provider="cuda", range_fallback="fp32", fp32_products="split")
    assert any(d.precision == "fp32" and d.op_type == "MatMul" for d in result.decisions)
    assert not any("TF32" in w for w in result.provider_warnings)
    assert not any(d.rule == "tf32.split" for d in result.decisions)  # nor split: TF32 has FP32's range


def test_what_the_warning_says_tf32_undoes_the_signal_path_rule():
    """The premise, measured: cqt-log's signal-path Convs kept FP32 are as accurate as FP16 ones once
    their operands are read as TF32 (about 100x the exact FP32 error)."""
    entry, fp32 = catalog.get("cqt-log"), catalog.load("cqt-log")
    kept = convert(fp32, provider="cuda").model
    low = convert(fp32, provider="cuda", allow_nodes=_SIGNAL_PATH).model
    errors: dict[str, list[float]] = {"exact": [], "tf32": [], "fp16": []}
    models = {"exact": emulate(kept), "tf32": emulate(kept, tf32=True), "fp16": emulate(low)}
    for seed in range(3):
        feeds = entry.make_inputs(np.random.default_rng(100 + seed))
        ref = run_onnxruntime(fp32, feeds)
        for label, model in models.items():
            got = run_onnxruntime(model, feeds)
            errors[label].append(max(accuracy("y", [r], [g]).rel_l2 or 0.0 for r, g in zip(ref, got, strict=True)))
    exact, tf32, fp16 = (float(np.mean(errors[k])) for k in ("exact", "tf32", "fp16"))
    assert tf32 > 30 * exact and tf32 > 0.8 * fp16


def test_split_products_hold_the_signal_path_rule_on_a_tf32_gpu():
    """``--fp32-products split``: cqt-log's three Convs written TF32-proof err read as TF32 within 2% of
    exact FP32 (2.50e-4 against 2.49e-4; 2.3e-2 unsplit), and nothing is left to warn of."""
    entry, fp32 = catalog.get("cqt-log"), catalog.load("cqt-log")
    result = convert(fp32, provider="cuda", fp32_products="split")
    assert sum(d.rule == "tf32.split" and d.op_type == "Conv" for d in result.decisions) == 9  # 3 more each
    assert not any("TF32" in w for w in result.provider_warnings)
    exact, tf32 = [], []
    for seed in range(3):
        feeds = entry.make_inputs(np.random.default_rng(100 + seed))
        ref = run_onnxruntime(fp32, feeds)
        for found, model in ((exact, emulate(result.model)), (tf32, emulate(result.model, tf32=True))):
            got = run_onnxruntime(model, feeds)
            found.append(max(accuracy("y", [r], [g]).rel_l2 or 0.0 for r, g in zip(ref, got, strict=True)))
    assert float(np.mean(tf32)) <= 1.02 * float(np.mean(exact)) < 1e-3


def test_tensorrt_runs_a_product_of_dequantized_operands_in_int8_and_is_not_warned_of():
    """DequantizeLinear -> MatMul -> QuantizeLinear: TensorRT's explicit quantization runs the group as an
    int8 kernel, where TF32 has no say; onnxruntime's CUDA provider runs the MatMul in FP32 (TF32)."""
    m = make_model(
        [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="qx"),
         helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="dqx"),
         helper.make_node("DequantizeLinear", ["wq", "s", "z"], ["wd"], name="dqw"),
         helper.make_node("MatMul", ["xd", "wd"], ["p"], name="mm"),
         helper.make_node("QuantizeLinear", ["p", "s", "z"], ["pq"], name="qp"),
         helper.make_node("DequantizeLinear", ["pq", "s", "z"], ["y"], name="dqy")],
        [vi("x", F32, [2, 8])], [vi("y", F32, [2, 8])],
        [tensor("s", np.array(0.05, np.float32)), tensor("z", np.array(0, np.int8)),
         tensor("wq", np.arange(64, dtype=np.int8).reshape(8, 8))],
    )
    on = {p: convert(m, provider=p, probe=False) for p in ("cuda", "tensorrt")}
    assert [d.rule for d in on["cuda"].decisions if d.node == "mm"] == ["quantized.requantize"]
    assert any("TF32" in w and "mm" in w for w in on["cuda"].provider_warnings)
    assert not any("TF32" in w for w in on["tensorrt"].provider_warnings)


def test_products_fp32_for_want_of_a_low_type_are_not_warned_of_and_unnamed_ones_are_placed():
    """A product FP32 because its schema takes no low type (rule fixed) was chosen for no precision:
    TF32 undoes nothing. An unnamed product the warning names is named by its op and position."""
    from amp_compiler.core.decision import NodeDecision
    from amp_compiler.onnx.write.tf32 import tf32_warnings
    from amp_compiler.targets import Provider

    def decision(index: int, rule: str) -> NodeDecision:
        return NodeDecision("main", "", "Conv", "ai.onnx", "fp32", rule, "", ["float"], ["float"], index)

    assert tf32_warnings([decision(0, "fixed"), decision(1, "provider.no-kernel")], Provider.CUDA) == []
    (line,) = tf32_warnings([decision(0, "fixed"), decision(4, "user.block-op")], Provider.CUDA)
    assert line.startswith("1 matrix product kept in FP32 for precision (Conv #4: user.block-op)")
