"""The final kernel check: each node's final types are looked up in the GPU provider's kernel table; an
FP32 that was a Cast-bytes choice moves where FP32 has no kernel, and what stays without one is warned of
once per op type (GroupQueryAttention has CUDA kernels in float16/bfloat16 only; onnxruntime's CPU
layout ops, com.microsoft.nchwc, in no type), and left out of the TF32 warning."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from amp_compiler import convert
from amp_compiler.core.measures import TensorRange
from amp_compiler.core.plan import Rule
from amp_compiler.onnx.graph.precision_graph import build_precision_graph
from amp_compiler.onnx.load.typed import checked_typed_ir
from amp_compiler.passes.analysis import FinalKernelPass
from amp_compiler.passes.analysis.pipeline import AnalysisSettings, analysis_passes, run_passes
from amp_compiler.policy import default_table
from amp_compiler.policy.kernels import KernelCoverage, KernelDef, load_snapshot
from amp_compiler.targets import Provider, Target
from tests.support.onnx_builders import F32, model, tensor, vi, weights

INT32 = onnx.TensorProto.INT32
HEADS, KV, HEAD = 4, 2, 16
D = HEADS * HEAD


def _gqa() -> onnx.ModelProto:
    """MatMul (packed QKV) -> GroupQueryAttention over a KV cache -> MatMul: a model-builder decoder's layer."""
    qkv = (HEADS + 2 * KV) * HEAD
    gqa = helper.make_node(
        "GroupQueryAttention", ["qkv", "", "", "past_key", "past_value", "seqlens_k", "total_len"],
        ["att", "present_key", "present_value"], domain="com.microsoft", name="gqa", num_heads=HEADS,
        kv_num_heads=KV)
    return model(
        [helper.make_node("MatMul", ["x", "wqkv"], ["qkv"], name="qkv_proj"), gqa,
         helper.make_node("MatMul", ["att", "wo"], ["y"], name="out_proj")],
        [vi("x", F32, [1, 4, D]), vi("past_key", F32, [1, KV, "past", HEAD]), vi("past_value", F32, [1, KV, "past", HEAD]),
         vi("seqlens_k", INT32, [1]), vi("total_len", INT32, [])],
        [vi("y", F32, [1, 4, D]), vi("present_key", F32, [1, KV, "total", HEAD]), vi("present_value", F32, [1, KV, "total", HEAD])],
        [tensor("wqkv", weights((D, qkv))), tensor("wo", weights((D, D), seed=1))],
        opset=17, extra_opsets=[helper.make_opsetid("com.microsoft", 1)],
    )


def _gqa_lines(result) -> list[str]:
    return [w for w in result.provider_warnings if "GroupQueryAttention" in w and "no kernel" in w]


def test_a_blocked_group_query_attention_is_warned_of() -> None:
    result = convert(_gqa(), block_ops=["GroupQueryAttention"], probe=False)
    (d,) = [d for d in result.decisions if d.op_type == "GroupQueryAttention"]
    assert (d.precision, d.rule) == ("fp32", "user.block-op")  # the user's choice stands
    (line,) = _gqa_lines(result)
    assert line.startswith("1 GroupQueryAttention node(s) (gqa) run in types the CUDA provider has no kernel for "
                           "(rule user.block-op: ")
    assert "CUDA" in line and "T=float" in line and "CPU provider" in line and "FP16, BF16" in line


def test_the_tf32_warning_leaves_out_products_without_an_fp32_kernel() -> None:
    """No FP32 GroupQueryAttention kernel on CUDA: nothing runs it as TF32. A blocked MatMul still is."""
    result = convert(_gqa(), block_ops=["GroupQueryAttention"], probe=False)
    assert not any("TF32" in w for w in result.provider_warnings)
    both = convert(_gqa(), block_ops=["GroupQueryAttention"], block_nodes=["^out_proj$"], probe=False)
    (line,) = [w for w in both.provider_warnings if "TF32" in w]
    assert line.startswith("1 matrix product kept in FP32 for precision (out_proj: user.block-node)")


def test_a_range_pinned_group_query_attention_under_an_fp32_fallback_is_warned_of() -> None:
    ranges = {"att": TensorRange(-1e5, 1e5, 1e5, 0.0, 0.0, 256)}
    result = convert(_gqa(), ranges=ranges, range_fallback="fp32", probe=False)
    (d,) = [d for d in result.decisions if d.op_type == "GroupQueryAttention"]
    # its output FP32 (FP16 overflows; BF16 not allowed), its KV cache FP16: no kernel takes that either
    assert (d.precision, d.rule, d.input_dtypes[3], d.output_dtypes) == ("mixed", "calibration.overflow", "fp16",
                                                             ["fp32", "fp16", "fp16"])
    (line,) = _gqa_lines(result)
    assert "calibration.overflow" in line and "T=float, T_CACHE=float16" in line and "--range-fallback bf16" in line


def test_under_a_bf16_range_fallback_the_kv_cache_follows_the_attention_into_bf16() -> None:
    """The range fallback moves the range-pinned output to BF16; no CUDA kernel takes it with an FP16 cache."""
    ranges = {"att": TensorRange(-1e5, 1e5, 1e5, 0.0, 0.0, 256)}
    for fallback in ("bf16", "scaled"):
        bf16 = convert(_gqa(), ranges=ranges, range_fallback=fallback, probe=False)
        (d,) = [d for d in bf16.decisions if d.op_type == "GroupQueryAttention"]
        assert (d.precision, d.input_dtypes[3], d.output_dtypes) == ("bf16", "bf16", ["bf16"] * 3)
        assert _gqa_lines(bf16) == []
        cache = [d for d in bf16.decisions if d.op_type == "Cast" and "past_key" in d.reason]
        assert [c.output_dtypes for c in cache] == [["bf16"]]


def test_group_query_attention_in_fp16_and_the_cpu_provider_say_nothing() -> None:
    assert _gqa_lines(convert(_gqa(), probe=False)) == []
    assert _gqa_lines(convert(_gqa(), block_ops=["GroupQueryAttention"], provider="cpu", probe=False)) == []


def _nchwc() -> onnx.ModelProto:
    """Conv + Relu as onnxruntime's CPU optimizer writes it at ORT_ENABLE_ALL: nchwc layout ops."""
    nodes = [
        helper.make_node("ReorderInput", ["x"], ["x8"], domain="com.microsoft.nchwc", name="reorder_in"),
        helper.make_node("Conv", ["x8", "w", "b"], ["y8"], domain="com.microsoft.nchwc", name="conv",
                         activation="Relu", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("ReorderOutput", ["y8"], ["y"], domain="com.microsoft.nchwc", name="reorder_out",
                         channels_last=0, channels=8),
    ]
    return model(nodes, [vi("x", F32, [1, 8, 8, 8])], [vi("y", F32, [1, 8, 8, 8])],
                 [tensor("w", weights((8, 8, 3, 3))), tensor("b", np.zeros(8, np.float32))],
                 opset=17, extra_opsets=[helper.make_opsetid("com.microsoft.nchwc", 1)])


def test_a_graph_of_cpu_only_layout_ops_gets_one_notice() -> None:
    result = convert(_nchwc(), probe=False)
    (line,) = [w for w in result.provider_warnings if "com.microsoft.nchwc" in w]
    assert line.startswith("3 node(s) of domain com.microsoft.nchwc (Conv 1, ReorderInput 1, ReorderOutput 1)")
    assert "no kernel for any op" in line and "CPU provider" in line


def _relu_only_fp16() -> KernelCoverage:
    """The CUDA snapshot with Relu in float16 alone (as GemmaRotaryEmbedding, a FOLLOW op, is)."""
    real = load_snapshot()
    kernels = dict(real.kernels)
    kernels[("ai.onnx", "Relu")] = (KernelDef(1, 2**31 - 1, {"T": frozenset({"float16"})}),)
    return KernelCoverage(Provider.CUDA, real.onnxruntime_version, "a test table", kernels)


def test_an_fp32_that_was_painting_s_choice_moves_to_the_kernel_s_type() -> None:
    """A lone Relu is painted FP32 (no low-precision neighbours): with no FP32 kernel it takes FP16."""
    proto = model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [vi("x", F32, [4, 8])], [vi("y", F32, [4, 8])])
    ir_model = checked_typed_ir(proto, "relu", deferred=False, check=True)
    graph = build_precision_graph(ir_model, Target.FP16, default_table())
    passes = [p for p in analysis_passes(AnalysisSettings(Target.FP16)) if not isinstance(p, FinalKernelPass)]
    before = run_passes(graph, passes, check=True)
    (vid,) = graph.node_vertices[ir_model.graph.node(0)]
    assert before.decisions[vid].rule in (Rule.PAINT_DEFAULT, Rule.MINCUT) and before.decisions[vid].dtype.name == "FLOAT"
    plan = run_passes(graph, [*passes, FinalKernelPass(coverage=_relu_only_fp16())], check=True)
    assert (plan.decisions[vid].dtype.name, plan.decisions[vid].rule) == ("FLOAT16", Rule.PROVIDER_KERNEL_TYPES)
    assert plan.no_kernel == {}


def test_an_op_onnx_defines_with_a_function_body_is_no_missing_kernel() -> None:
    """onnxruntime expands GroupNormalization-21 (torch.onnx's for diffusion UNets), Mish, ... into their
    function bodies where it has no kernel: the warning said it refused models it loads and runs (sweep W)."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("GroupNormalization", ["c", "s", "b"], ["g"], num_groups=2),
             helper.make_node("Mish", ["g"], ["y"])]
    inits = [tensor("w", weights((4, 4, 3, 3), 1)), tensor("s", np.ones(4, np.float32)),
             tensor("b", np.zeros(4, np.float32))]
    fp32 = model(nodes, [vi("x", F32, [1, 4, 8, 8])], [vi("y", F32, [1, 4, 8, 8])], inits, opset=21)
    result = convert(fp32)
    assert not any("GroupNormalization" in w or "Mish" in w for w in result.provider_warnings), result.provider_warnings
    import onnxruntime as ort

    ort.InferenceSession(result.model.SerializeToString(), providers=["CPUExecutionProvider"])  # it loads
