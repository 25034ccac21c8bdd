"""TensorRT's type table: the snapshot of its ONNX parser's operator table, the one lookup for every
provider, and what ``--provider tensorrt`` keeps FP32 because of it (``provider.no-kernel``)."""

import json
from pathlib import Path

import onnx
import onnx_ir as ir
import pytest
from onnx import helper

from amp_compiler import convert
from amp_compiler.core.plan import PrecisionPlan, Role, Rule
from amp_compiler.onnx.graph.precision_graph import build_precision_graph
from amp_compiler.passes.analysis import ClassifyPass, KernelCoveragePass
from amp_compiler.policy import default_table
from amp_compiler.policy import kernels as providers
from amp_compiler.policy.kernels import KernelCoverage, coverage_for, load_snapshot, load_trt_snapshot, trt_coverage
from amp_compiler.policy.make_trt_snapshot import TableError, dump, parse, snapshot
from amp_compiler.targets import Provider, Target
from tests.policy.test_kernels import _gridsample_model
from tests.support.onnx_builders import F32, model, tensor, vi, weights

TABLE = """
# Supported ONNX Operators

TensorRT 10.9 supports operators in the inclusive range of opset 9 to opset 22. More details below.

## Operator Support Matrix

| Operator                  | Supported  | Supported Types | Restrictions |
|---------------------------|------------|-----------------|--------------|
| Conv                      | Y          | FP32, FP16, BF16 |
| ConstantOfShape           | Y          | FP32, FP16, BF16, INT32, INF64, BOOL |
| DequantizeLinear          | Y          | INT8, FP8, INT4 | `x_zero_point` must be zero |
| DFT                       | N          |
| DynamicQuantizeLinear     | N          | Not supported. Compose it from ONNX operators.
| Mish                      | Y          | FP32 | made up: no FP16 |
| Relu                      | Y          | FP32, FP16, BF16, INT32, INT64 |
"""


# -- the snapshot ------------------------------------------------------------------------------


def test_the_table_is_parsed_row_by_row():
    table = parse(TABLE)
    assert table["tensorrt_version"] == "10.9" and table["opsets"] == [9, 22]
    ops = table["ops"]
    assert ops["Conv"] == {"imported": True, "types": ["float", "float16", "bfloat16"]}
    assert ops["ConstantOfShape"]["types"] == ["float", "float16", "bfloat16", "int32", "int64", "bool"]  # INF64
    assert ops["DequantizeLinear"] == {"imported": True, "types": ["int8", "float8e4m3fn", "int4"],
                                       "restrictions": "`x_zero_point` must be zero"}
    assert ops["DFT"] == {"imported": False, "types": []}
    assert ops["DynamicQuantizeLinear"]["restrictions"].startswith("Not supported.")
    assert list(ops) == sorted(ops)


@pytest.mark.parametrize("broken, message", [
    (TABLE.replace("TensorRT 10.9 supports", "TensorRT supports"), "inclusive range"),
    (TABLE.replace("## Operator Support Matrix", ""), "Operator Support Matrix"),
    (TABLE.replace("FP32, FP16, BF16 |\n| ConstantOfShape", "FP32, FP12 |\n| ConstantOfShape"), "FP12"),
    (TABLE.replace("| Relu                      | Y", "| Relu                      | Maybe"), "Relu"),
    (TABLE + "| Conv | Y | FP32 |\n", "two rows"),
], ids=["no-header", "no-matrix", "unknown-type", "bad-supported", "twice"])
def test_a_table_it_cannot_read_stops_it(broken, message):
    with pytest.raises(TableError, match=message):
        parse(broken)


def test_the_shipped_snapshot_states_its_release_and_source():
    data = providers.read_trt_snapshot_data()
    assert data["tensorrt_version"] == "10.15" and data["opsets"] == [9, 24]
    assert "onnx/onnx-tensorrt docs/operators.md" in data["source"] and "96e781103cfc" in data["source"]
    assert data["generated_by"].startswith("python -m amp_compiler.policy.make_trt_snapshot")
    s = data["summary"]
    assert s["ops"] == len(data["ops"]) and s["imported"] == len(load_trt_snapshot().kernels) >= 150
    assert s["imported_float_only_fp32"] == 1 and data["ops"]["STFT"]["types"] == ["float"]


def test_the_snapshot_file_is_what_the_generator_writes():
    text = (Path(providers.__file__).parent / providers.TRT_SNAPSHOT).read_text("utf-8")
    assert dump(json.loads(text)) == text
    data = snapshot(TABLE, "a test table")
    assert json.loads(dump(data)) == data and data["summary"]["imported_float_only_fp32"] == 1


# -- one lookup, both providers ------------------------------------------------------------------


def test_one_lookup_answers_per_op_and_type_for_both_providers(snapshot_only):
    trt, cuda = coverage_for(Provider.TENSORRT), coverage_for(Provider.CUDA)
    assert trt.float_types("", "MatMul", 13) == ["float", "float16", "bfloat16"]
    assert trt.float_types("", "GridSample", 22) == ["float", "float16"]  # no BF16 in TensorRT
    assert trt.float_types("", "STFT", 17) == ["float"]
    assert not trt.takes("", "STFT", 17, "float16") and trt.takes("", "STFT", 17, "float")
    assert trt.takes("", "DequantizeLinear", 21, "float16")  # its list names its quantized input only
    assert not trt.has_op("", "DFT") and not trt.has_op("com.microsoft", "Attention")
    assert cuda.takes("", "Conv", 11, "float16") and not cuda.takes("", "Conv", 11, "bfloat16")
    assert cuda.takes("", "Conv", 22, "bfloat16")
    assert trt.fallback is load_snapshot() and trt.notes[("ai.onnx", "GridSample")] == "Input must be 4D input."
    # a node's types: the table's list applies to every float type parameter, not to indices
    assert trt.supports("", "Gather", 13, [("T", ["float16"]), ("Tind", ["int64"])])
    assert not trt.supports("", "GridSample", 22, [("T1", ["bfloat16"]), ("T2", ["bfloat16", "float"])])


# -- what --provider tensorrt keeps FP32 ---------------------------------------------------------


def test_an_op_tensorrt_imports_without_bf16_stays_fp32_with_its_source(snapshot_only):
    m = _gridsample_model(22)
    d = {x.node: x for x in convert(m, target="bf16", provider="tensorrt", probe=False).decisions}
    assert d["gs"].precision == "fp32" and d["gs"].rule == Rule.PROVIDER_NO_KERNEL.value
    assert "TensorRT's ONNX parser imports GridSample in FP32, FP16 only, not BF16" in d["gs"].reason
    assert "TensorRT 10.15 ONNX parser operator table" in d["gs"].reason
    assert d["conv1"].precision == d["conv2"].precision == "bf16"
    fp16 = {x.node: x for x in convert(m, target="fp16", provider="tensorrt", probe=False).decisions}
    assert fp16["gs"].precision == "fp16"  # FP16 it imports


def _plan(m: onnx.ModelProto, coverage: KernelCoverage) -> tuple:
    ir_model = ir.from_proto(onnx.shape_inference.infer_shapes(m))
    graph = build_precision_graph(ir_model, Target.FP16, default_table())
    plan = PrecisionPlan()
    ClassifyPass(Provider.TENSORRT)(graph, plan)
    KernelCoveragePass(Provider.TENSORRT, coverage)(graph, plan)
    return graph, plan


def test_an_op_whose_tensorrt_type_list_lacks_fp16_stays_fp32_with_the_reason():
    """The shipped table lists FP16 for every imported op but STFT (range-sensitive: FP32 by the
    policy anyway); a table whose Mish lacks FP16 keeps Mish FP32, FIXED (nothing spreads)."""
    m = model(
        [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"), helper.make_node("Mish", ["h"], ["y"], name="mish")],
        [vi("x", F32, [2, 8])], [vi("y", F32, [2, 8])], [tensor("w", weights((8, 8)))], opset=18,
    )
    coverage = trt_coverage(snapshot(TABLE, "a test table"))
    graph, plan = _plan(m, coverage)
    (mish,) = [v for v in graph.vertices if v.node is not None and v.node.name == "mish"]
    assert plan.roles[mish.id] is Role.FIXED and plan.role_rules[mish.id][0] is Rule.PROVIDER_NO_KERNEL
    reason = plan.role_rules[mish.id][1]
    assert reason == ("FP32: TensorRT's ONNX parser imports Mish in FP32 only, not FP16 "
                      "(TensorRT 10.9 ONNX parser operator table; its restrictions: made up: no FP16)")
    shipped = {d.node: d.rule for d in convert(m, provider="tensorrt", probe=False).decisions}
    assert shipped["mish"] != Rule.PROVIDER_NO_KERNEL.value  # the shipped table: FP16 it imports


def test_an_op_tensorrt_does_not_import_is_decided_by_its_fallback():
    """onnxruntime's TensorRT provider runs what TensorRT does not import on CUDA: CUDA's coverage decides."""
    m = model(
        [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"), helper.make_node("Relu", ["h"], ["y"], name="relu")],
        [vi("x", F32, [2, 8])], [vi("y", F32, [2, 8])], [tensor("w", weights((8, 8)))], opset=18,
    )
    data = snapshot(TABLE, "a test table")
    del data["ops"]["Relu"]
    no_relu = KernelCoverage(Provider.CUDA, "0", "a CUDA registry without Relu", {
        ("ai.onnx", "MatMul"): load_snapshot().kernels[("ai.onnx", "MatMul")]})
    coverage = trt_coverage(data)
    graph, plan = _plan(m, KernelCoverage(**{**coverage.__dict__, "fallback": no_relu}))
    (relu,) = [v for v in graph.vertices if v.node is not None and v.node.name == "relu"]
    assert plan.role_rules[relu.id] == (
        Rule.PROVIDER_NO_KERNEL,
        "FP32: TensorRT does not import Relu-14, and no CUDA kernel for Relu-14 in any type (onnxruntime would run "
        "it on the CPU) (a CUDA registry without Relu)",
    )
