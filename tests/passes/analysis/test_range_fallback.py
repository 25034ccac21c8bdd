"""The range fallback: Tensor Core ops that only FP16's range keeps out of FP16 run in BF16 where the
provider has the kernel; other range-pinned ops, and what needs FP32 arithmetic, stay FP32."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from amp_compiler import ConvertOptions, convert
from amp_compiler.core.measures import TensorRange
from amp_compiler.errors import OptionError
from amp_compiler.onnx.measure.checks import run_onnxruntime
from amp_compiler.onnx.measure.emulate import emulate
from amp_compiler.onnx.tolerance.refine import refine
from models import catalog
from tests.onnx.graph.test_intervals import INT16, _int16_audio
from tests.support.onnx_builders import F32, model, tensor, vi, weights

BF16 = onnx.TensorProto.BFLOAT16
FP16 = onnx.TensorProto.FLOAT16


def _scaled():
    """MatMul -> MatMul(weights up to 1e5) -> Add -> Mul(1e-5) -> MatMul: the second MatMul's weights
    are beyond FP16 (a folded scale), the Add and the Mul read its large result. The first reads x with K = 16
    (a shorter product of the input would stay FP32 for its own reason: policy.high.raw-small-product)."""
    w_big = weights((8, 8), seed=2) * np.float32(1e5)
    return model(
        [helper.make_node("MatMul", ["x", "w"], ["a"], name="mm1"),
         helper.make_node("MatMul", ["a", "w_big"], ["b"], name="big_mm"),
         helper.make_node("Add", ["b", "bias"], ["c"], name="add"),
         helper.make_node("Mul", ["c", "small"], ["s"], name="unscale"),
         helper.make_node("MatMul", ["s", "w2"], ["y"], name="mm2")],
        [vi("x", F32, [4, 16])], [vi("y", F32, [4, 8])],
        [tensor("w", weights((16, 8))), tensor("w2", weights((8, 8), seed=1)), tensor("w_big", w_big),
         tensor("bias", np.full((8,), 1e5, np.float32)), tensor("small", np.array([1e-5], np.float32))],
    )


def _decisions(result):
    return {d.node: d for d in result.decisions}


def test_a_tensor_core_op_beyond_fp16_takes_bf16_an_elementwise_one_fp32():
    r = convert(_scaled(), probe=False)
    d = _decisions(r)
    assert (d["big_mm"].precision, d["big_mm"].rule) == ("bf16", "constant.overflow")
    assert "range fallback" in d["big_mm"].reason
    # BF16 buys the Add no Tensor Core FLOPs and costs it 16 mantissa bits: FP32
    assert (d["add"].precision, d["add"].rule) == ("fp32", "constant.overflow")
    assert d["mm1"].precision == d["mm2"].precision == "fp16"
    # the Cast between the FP16 MatMul and the BF16 one converts directly, no FP32 hop
    producers = {o: n for n in r.model.graph.node for o in n.output}
    casts = [n for n in r.model.graph.node if n.op_type == "Cast" and n.attribute[0].i == BF16]
    assert [producers[c.input[0]].name for c in casts] == ["mm1"]


def test_fp32_fallback_and_the_cpu_provider_keep_fp32():
    for kw in ({"range_fallback": "fp32"}, {"provider": "cpu"}):
        d = _decisions(convert(_scaled(), probe=False, **kw))
        assert (d["big_mm"].precision, d["big_mm"].rule) == ("fp32", "constant.overflow"), kw


def test_bf16_fallback_is_as_accurate_and_finite_under_exact_emulation():
    m = _scaled()
    x = {"x": np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)}
    ref = run_onnxruntime(m, x)[0]
    got = run_onnxruntime(emulate(convert(m, probe=False).model), x)[0]
    assert np.isfinite(got).all()
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-2


def test_an_op_that_needs_fp32_arithmetic_stays_fp32_whatever_its_range():
    """Exp (HIGH) overflowing FP16 on calibration data stays FP32; the MatMul reading its result
    (pinned by calibration.overflow) takes BF16."""
    m = model(
        [helper.make_node("MatMul", ["x", "w"], ["a"], name="mm"),
         helper.make_node("Exp", ["a"], ["e"], name="exp"),
         helper.make_node("MatMul", ["e", "w"], ["y"], name="mm_e")],
        [vi("x", F32, [4, 8])], [vi("y", F32, [4, 8])],
        [tensor("w", weights((8, 8)))],
    )
    ranges = {"e": TensorRange(0.0, 1e6, 1e6, 0.0, 0.0, 32)}
    d = _decisions(convert(m, ranges=ranges, probe=False))
    assert d["exp"].precision == "fp32" and d["exp"].rule.startswith("policy.high")
    assert (d["mm_e"].precision, d["mm_e"].rule) == ("bf16", "calibration.overflow")


def test_a_range_pinned_op_without_a_bf16_kernel_stays_fp32_and_says_why():
    """The int16 audio front end: its STFT is a Conv at opset 11, which has no BF16 kernel on CUDA."""
    fp32 = catalog.load("stft-power-mel")
    result = convert(fp32, input_ranges={"audio": INT16}, probe=False)
    d = _decisions(result)
    assert (d["stft"].precision, d["stft"].rule) == ("fp32", "input-range.overflow")
    assert "provider.no-kernel" in d["stft"].reason and "BF16" in d["stft"].reason
    assert d["mel"].precision == "bf16" and d["fc1"].precision == "fp16"
    assert d["square"].precision == "fp32"  # elementwise: FP32
    x = _int16_audio()
    ref = run_onnxruntime(fp32, x)[0]
    err = {}
    for name, converted in (("mixed", result), ("bf16", convert(fp32, target="bf16", probe=False))):
        got = run_onnxruntime(emulate(converted.model), x)[0]
        assert np.isfinite(got).all()
        err[name] = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert err["mixed"] < err["bf16"] / 5


def test_unknown_fallback_and_bf16_with_tolerance_are_one_line_errors():
    with pytest.raises(OptionError, match="expected scaled, bf16 or fp32"):
        convert(_scaled(), range_fallback="fp8", probe=False)
    x = {"x": np.ones((4, 16), np.float32)}
    for fallback in ("bf16", "scaled"):
        with pytest.raises(OptionError, match="not combined with --tolerance"):
            refine(_scaled(), [x], 1e-3, ConvertOptions(range_fallback=fallback))


def test_fp8_with_an_fp16_fallback_keeps_the_range_fallback_and_its_rule():
    """--target fp8 --fallback fp16: a GEMM beyond FP16 kept out of FP8 runs in BF16 under its range
    rule (not fp8.kept-fp16), and the mixed FP8/FP16/BF16 model emulates finite."""
    m = _scaled()
    samples = [{"x": np.random.default_rng(i).standard_normal((4, 16)).astype(np.float32)} for i in range(3)]
    r = convert(m, target="fp8", fallback="fp16", samples=samples, probe=False)
    d = _decisions(r)
    assert (d["big_mm"].precision, d["big_mm"].rule) == ("bf16", "constant.overflow")
    got = run_onnxruntime(emulate(r.model), samples[0])[0]
    assert np.isfinite(got).all()


def test_the_summary_line_counts_bf16_tensor_core_ops(tmp_path, capsys):
    from amp_compiler.cli import main

    onnx.save(_scaled(), tmp_path / "m.onnx")
    assert main(["convert", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o.onnx"), "--range-fallback", "bf16"]) == 0
    out = capsys.readouterr().out
    assert "nodes: bf16 1," in out and "Tensor Core ops in fp16: 2/3 (bf16 range fallback: 1)" in out
