"""A LayerNorm written as elementwise ops keeps a type onnxruntime's norm fusion can fuse (``runtime.ort-layernorm-fusion``).

onnxruntime's LayerNormFusion (default level, CPU/CUDA/ROCm/DML) fuses ReduceMean, Sub, Pow, ReduceMean,
Add, Sqrt, Div, Mul, Add with the Cast at its input into one LayerNormalization reading the tensor before
that Cast and the Mul's scale. With the body FP32 after an FP16 MatMul and an FP32 scale, that node had
FP16 X and FP32 scale: from opset 17 its schema refuses it and every session failed at creation
(``amp-compiler convert`` exit 1); below 17 the BF16 one has no kernel. The scale and bias now take the
input's type, the statistics stay FP32 (the fused kernel computes in FP32 inside).
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

from amp_compiler import convert
from amp_compiler.core.plan import Rule
from models import catalog
from tests.support.onnx_builders import F32, model, tensor, vi, weights

RULE = Rule.RUNTIME_LAYERNORM_FUSION.value


def _layernorm(eps: float, opset: int = 18, bias: bool = False):
    """x [2, 16, 64] -> MatMul (-> Add bias) -> LayerNorm written as torch.onnx writes it -> MatMul -> y."""
    n = helper.make_node
    if opset >= 18:
        mean = lambda i, o, name: n("ReduceMean", [i, "axes"], [o], name=name)  # noqa: E731
    else:
        mean = lambda i, o, name: n("ReduceMean", [i], [o], name=name, axes=[-1])  # noqa: E731
    nodes = [n("MatMul", ["x", "w1"], ["h0" if bias else "h"], name="proj_in")]
    nodes += [n("Add", ["h0", "b1"], ["h"], name="proj_in_bias")] if bias else []
    nodes += [mean("h", "u", "ln_mean"), n("Sub", ["h", "u"], ["d"], name="ln_sub"),
              n("Pow", ["d", "two"], ["d2"], name="ln_pow"), mean("d2", "v", "ln_var"),
              n("Add", ["v", "eps"], ["ve"], name="ln_eps"), n("Sqrt", ["ve"], ["s"], name="ln_sqrt"),
              n("Div", ["d", "s"], ["nd"], name="ln_div"), n("Mul", ["nd", "g"], ["ng"], name="ln_scale"),
              n("Add", ["ng", "b"], ["nb"], name="ln_bias"), n("MatMul", ["nb", "w2"], ["y"], name="proj_out")]
    inits = [tensor("w1", weights((64, 128), scale=0.1)), tensor("w2", weights((128, 64), seed=1, scale=0.1)),
             tensor("two", np.float32(2.0)), tensor("eps", np.float32(eps)),
             tensor("g", np.linspace(0.5, 1.5, 128, dtype=np.float32)), tensor("b", weights((128,), seed=2)),
             tensor("b1", weights((128,), seed=3)), tensor("axes", np.array([-1], np.int64))]
    return model(nodes, [vi("x", F32, [2, 16, 64])], [vi("y", F32, [2, 16, 64])], inits, opset=opset)


def _session(m) -> ort.InferenceSession:
    """A session at onnxruntime's default optimisation level, where its LayerNormFusion runs."""
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])


X = np.random.default_rng(0).standard_normal((2, 16, 64)).astype(np.float32)


@pytest.mark.parametrize("eps", [1e-5, 1e-6, 1e-12])
@pytest.mark.parametrize("provider", ["cuda", "tensorrt", "cpu"])
def test_a_handwritten_layernorm_after_an_fp16_matmul_converts_and_loads(eps, provider):
    result = convert(_layernorm(eps), provider=provider, probe=False)
    rules = {d.node: (d.precision, d.rule) for d in result.decisions}
    assert rules["proj_in"][0] == rules["proj_out"][0] == "fp16"  # the Tensor Core ops stay low
    assert rules["ln_var"][0] == rules["ln_div"][0] == "fp32"  # the statistics stay FP32
    assert rules["ln_scale"] == rules["ln_bias"] == ("fp16", RULE)
    fp32 = _session(_layernorm(eps)).run(None, {"x": X})[0]
    low = _session(result.model).run(None, {"x": X})[0]  # fused by onnxruntime, and it runs
    assert np.abs(low - fp32).max() < 2e-3 * (fp32.max() - fp32.min())


@pytest.mark.parametrize("opset", [11, 14, 16, 18])
@pytest.mark.parametrize("target", ["fp16", "bf16"])
def test_every_opset_and_target_gets_a_scale_in_the_fused_input_type(opset, target):
    """Below opset 17 onnxruntime's own schema takes two types, with a kernel for FP16 X and FP32 scale
    (left as it was) but none for BF16 X and FP32 scale."""
    result = convert(_layernorm(1e-6, opset), target=target, probe=False)  # the load check passes
    rules = {d.node: (d.precision, d.rule) for d in result.decisions}
    if opset < 17 and target == "fp16":
        assert rules["ln_scale"][0] == rules["ln_bias"][0] == "fp32" and rules["ln_scale"][1] != RULE
        _session(result.model)
    else:
        assert rules["ln_scale"] == rules["ln_bias"] == (target, RULE)


def test_a_cast_shared_with_another_fp32_reader_is_not_fused_and_the_scale_stays_fp32():
    """The bias Add after the MatMul runs FP32 (torch.onnx's Linear): the Cast reads into it, not into the
    LayerNorm, so onnxruntime fuses the FP32 ops alone and nothing changes."""
    result = convert(_layernorm(1e-5, 14, bias=True), probe=False)
    rules = {d.node: (d.precision, d.rule) for d in result.decisions}
    assert rules["ln_scale"][0] == "fp32" and rules["ln_scale"][1] != RULE
    assert _session(result.model).run(None, {"x": X})[0].shape == (2, 16, 64)


def test_the_catalog_entry_converts_and_loads():
    result = convert(catalog.load("handwritten-layernorm"), probe=False)
    rules = {d.node: (d.precision, d.rule) for d in result.decisions}
    assert rules["ln_scale"] == ("fp16", RULE)
    _session(result.model)


def _rmsnorm():
    """x -> MatMul -> RMSNorm written as Pow, ReduceMean, Add, Sqrt, Div, Mul(scale) -> MatMul -> y."""
    n = helper.make_node
    nodes = [n("MatMul", ["x", "w1"], ["h"], name="proj_in"), n("Pow", ["h", "two"], ["h2"], name="rms_pow"),
             n("ReduceMean", ["h2", "axes"], ["v"], name="rms_mean"), n("Add", ["v", "eps"], ["ve"], name="rms_eps"),
             n("Sqrt", ["ve"], ["s"], name="rms_sqrt"), n("Div", ["h", "s"], ["nd"], name="rms_div"),
             n("Mul", ["nd", "g"], ["ng"], name="rms_scale"), n("MatMul", ["ng", "w2"], ["y"], name="proj_out")]
    inits = [tensor("w1", weights((64, 128), scale=0.1)), tensor("w2", weights((128, 64), seed=1, scale=0.1)),
             tensor("two", np.float32(2.0)), tensor("eps", np.float32(1e-6)),
             tensor("g", np.linspace(0.5, 1.5, 128, dtype=np.float32)), tensor("axes", np.array([-1], np.int64))]
    return model(nodes, [vi("x", F32, [2, 16, 64])], [vi("y", F32, [2, 16, 64])], inits)


def test_a_bf16_rmsnorm_scale_is_bf16_where_onnxruntime_fuses_it_with_its_casts():
    """CUDA's SimplifiedLayerNormalization has no kernel for BF16 X with an FP32 scale (a BF16 target is
    refused for the CPU provider, which has no BF16 MatMul)."""
    rules = {d.node: (d.precision, d.rule) for d in convert(_rmsnorm(), target="bf16", provider="cuda",
                                                                  probe=False).decisions}
    assert rules["rms_mean"][0] == "fp32"
    assert rules["rms_scale"] == ("bf16", RULE)
