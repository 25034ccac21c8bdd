"""What TensorRT's strongly typed networks need, checked on ``--provider tensorrt`` outputs: every
tensor typed by the graph, If/Loop branches typed alike, FP8 Q/DQ as its explicit quantization
reads them, no onnxruntime contrib op (one warning line instead), custom ops with a declared type."""

from __future__ import annotations

import functools

import numpy as np
import onnx
import pytest
from onnx import helper

from amp_compiler import convert
from amp_compiler.cli import main
from amp_compiler.errors import OptionError
from amp_compiler.onnx.load.typed import checked_typed_ir
from amp_compiler.onnx.write.strongly_typed import (
    branch_faults,
    foreign_ops_of,
    qdq_faults,
    strongly_typed_faults,
    tensorrt_warnings,
)
from models import catalog
from tests.support.fp8_builders import mlp, to_fp8
from tests.support.onnx_builders import F16, F32, model, tensor, vi, weights

SMALL = catalog.entries("small")


@functools.cache
def _fp32(name: str) -> onnx.ModelProto:
    return catalog.load(name)


# -- every catalog model ---------------------------------------------------------------------------


@pytest.mark.parametrize("entry", SMALL, ids=lambda e: e.name)
def test_every_catalog_models_tensorrt_output_is_a_strongly_typed_network(entry):
    """Typed by the graph, branches alike, Q/DQ as TensorRT reads them; a model with onnxruntime
    contrib ops keeps them (its output is for onnxruntime's TensorRT provider) and says so once."""
    fp32 = _fp32(entry.name)
    result = convert(fp32, provider="tensorrt", probe=False)
    faults = strongly_typed_faults(result.model)
    contrib = [w for w in result.provider_warnings if w.startswith("onnxruntime contrib ops")]
    foreign = foreign_ops_of(fp32)
    if foreign:
        assert faults == [f"ops onnx does not define, which TensorRT's ONNX parser does not import: {', '.join(foreign)}"]
        assert len(contrib) == 1
    else:
        assert faults == [] and contrib == []
    assert len(result.provider_warnings) == len(set(w.split(" ")[0] for w in result.provider_warnings)) <= 3


# -- onnxruntime contrib ops ---------------------------------------------------------------------


def test_a_contrib_op_model_gets_one_line_for_tensorrt_and_none_for_cuda(tmp_path, capsys):
    fp32 = _fp32("bert-fused-small")
    (line,) = convert(fp32, provider="tensorrt", probe=False).provider_warnings
    assert line.startswith("onnxruntime contrib ops (com.microsoft::") and "convert the unfused export" in line
    assert "\n" not in line and convert(fp32, provider="cuda", probe=False).provider_warnings == []
    src, out = tmp_path / "bert.onnx", tmp_path / "out.onnx"
    src.write_bytes(fp32.SerializeToString())
    assert main(["convert", str(src), "-o", str(out), "--provider", "tensorrt", "--no-load-check"]) == 0
    _, err = capsys.readouterr()
    assert err.splitlines() == [f"amp-compiler: warning: {line}"] and out.exists()


def test_contrib_ops_are_decided_as_onnxruntimes_tensorrt_provider_runs_them():
    """TensorRT does not import them: onnxruntime's TensorRT provider runs them on CUDA, whose kernels
    of SkipLayerNormalization and EmbedLayerNormalization compute in FP32 inside: they take FP16 in
    and out, as for --provider cuda, with no Cast around them."""
    fp32 = _fp32("bert-fused-small")
    trt, cuda = convert(fp32, provider="tensorrt", probe=False), convert(fp32, provider="cuda", probe=False)
    skip = [d for d in trt.decisions if d.op_type == "SkipLayerNormalization"]
    assert skip and all(d.precision == "fp16" for d in skip)
    assert all("TensorRT does not import it: onnxruntime's cuda provider runs it)" in d.reason for d in skip)
    assert trt.casts_inserted == cuda.casts_inserted


def test_onnx_ops_tensorrt_does_not_import_get_one_line():
    m = model(
        [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"), helper.make_node("Det", ["h"], ["y"], name="det")],
        [vi("x", F32, [3, 4, 16])], [vi("y", F32, [3])], [tensor("w", weights((16, 4)))], opset=17,  # K = 16
    )
    line, cuda = convert(m, provider="tensorrt", probe=False).provider_warnings
    assert line.startswith("TensorRT 10.15's ONNX parser does not import Det (its operator table)")
    assert tensorrt_warnings(checked_typed_ir(m, "m", deferred=False, check=True)) == [line]
    # nor has onnxruntime's CUDA provider a Det kernel: the final kernel check says where it runs
    assert cuda.startswith("1 Det node(s) (det): the CUDA provider has no kernel for Det in any type")


# -- custom ops: --custom-op-precision -----------------------------------------------------------


def _custom_model() -> onnx.ModelProto:
    """x -> MatMul -> Frobnicate (com.example, no schema anywhere; typed by value_info) -> MatMul -> y."""
    m = model(
        [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
         helper.make_node("Frobnicate", ["h"], ["u"], name="frob", domain="com.example"),
         helper.make_node("MatMul", ["u", "w2"], ["y"], name="mm2")],
        [vi("x", F32, [2, 16])], [vi("y", F32, [2, 8])],  # K = 16: not policy.high.raw-small-product
        [tensor("w1", weights((16, 8), seed=1)), tensor("w2", weights((8, 8), seed=2))],
        opset=17, extra_opsets=[helper.make_opsetid("com.example", 1)],
    )
    m.graph.value_info.append(vi("u", F32, [2, 8]))
    return m


def _casts(m: onnx.ModelProto) -> list[tuple[str, str]]:
    return [(n.input[0], n.output[0]) for n in m.graph.node if n.op_type == "Cast"]


def test_an_undeclared_custom_op_stays_fp32_between_casts_and_tensorrt_says_so():
    result = convert(_custom_model(), provider="tensorrt", probe=False)
    d = {x.node: x for x in result.decisions}
    assert d["frob"].precision == "fp32" and d["frob"].rule == "policy.unknown-op"
    assert len(_casts(result.model)) == 4  # into and out of it, and at the graph's ends
    (line,) = result.provider_warnings
    assert line.startswith("custom ops (com.example::Frobnicate) keep their types") and "custom_op_precision" in line


@pytest.mark.parametrize("op", ["Frobnicate", "com.example::Frobnicate"])
def test_a_declared_custom_op_takes_the_precision_without_casts_around_it(op):
    result = convert(_custom_model(), provider="tensorrt", custom_op_precision={op: "fp16"}, probe=False)
    d = {x.node: x for x in result.decisions}
    assert d["frob"].precision == "fp16" and d["frob"].rule == "user.custom-op-precision"
    assert "fp16 as the user declared for com.example::Frobnicate (custom_op_precision)" in d["frob"].reason
    assert d["mm1"].precision == d["mm2"].precision == "fp16"
    assert _casts(result.model) == [("x", "x_fp16"), ("y_fp16", "y")]  # only at the graph's ends
    types = {v.name: v.type.tensor_type.elem_type for v in result.model.graph.value_info}
    assert types["u"] == onnx.TensorProto.FLOAT16  # its output is declared FP16 in the file
    assert result.provider_warnings == []
    assert strongly_typed_faults(result.model, custom=[("com.example", "Frobnicate")]) == []


def test_a_custom_op_declared_fp32_or_bf16_keeps_that_type():
    fp32 = {x.node: x for x in convert(_custom_model(), custom_op_precision={"Frobnicate": "fp32"}, probe=False).decisions}
    assert fp32["frob"].precision == "fp32" and fp32["frob"].rule == "user.custom-op-precision"
    mixed = convert(_custom_model(), custom_op_precision={"Frobnicate": "bf16"}, probe=False)
    assert {x.node: x.precision for x in mixed.decisions}["frob"] == "bf16"
    assert ("h", "h_bf16") in _casts(mixed.model)


@pytest.mark.parametrize("declared, message", [
    ({"Frobnicat": "fp16"}, "Frobnicat: no custom op of the model has that name (its custom ops: com.example::Frobnicate)"),
    ({"MatMul": "fp16"}, "MatMul is an op the op tables know"),
    ({"Frobnicate": "fp8"}, "Frobnicate=fp8: expected fp16, bf16 or fp32"),
    ({"other.domain::Frobnicate": "fp16"}, "no custom op of the model has that name"),
])
def test_a_declaration_that_fits_no_custom_op_is_one_clear_error(declared, message):
    with pytest.raises(OptionError, match=message.replace("(", r"\(").replace(")", r"\)")) as err:
        convert(_custom_model(), custom_op_precision=declared, probe=False)
    assert err.value.option == "custom_op_precision"


def test_the_command_line_flag(tmp_path, capsys):
    src, out = tmp_path / "m.onnx", tmp_path / "out.onnx"
    onnx.save(_custom_model(), src)
    assert main(["convert", str(src), "-o", str(out), "--custom-op-precision", "Frobnicate=fp16",
                 "--no-load-check", "-q"]) == 0
    produced = {v.name: v.type.tensor_type.elem_type for v in onnx.load(out).graph.value_info}
    assert produced["u"] == onnx.TensorProto.FLOAT16
    assert main(["convert", str(src), "-o", str(out), "--custom-op-precision", "Frobnicate"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "amp-compiler: error: --custom-op-precision: 'Frobnicate': expected OP=fp16|bf16|fp32 (e.g. MyPlugin=fp16)"
    ]


# -- If/Loop branches ------------------------------------------------------------------------------


def test_an_if_models_branches_end_typed_alike_for_tensorrt():
    """control_flow.py ties each If output to both branches' outputs (one vertex): whatever each
    branch computes inside, they end in the If's type."""
    result = convert(_fp32("if-branches"), provider="tensorrt", probe=False)
    assert branch_faults(result.model) == []
    ifs = [n for n in result.model.graph.node if n.op_type == "If"]
    assert ifs and any(d.precision == "fp16" for d in result.decisions if d.op_type == "If")
    inferred = onnx.shape_inference.infer_shapes(result.model, strict_mode=True)
    for node in ifs:
        then, other = (a.g for a in node.attribute if a.name in ("then_branch", "else_branch"))
        assert [o.type.tensor_type.elem_type for o in then.output] == [o.type.tensor_type.elem_type for o in other.output]
    assert strongly_typed_faults(inferred) == []
    assert strongly_typed_faults(convert(_fp32("loop-carried"), provider="tensorrt", probe=False).model) == []


def _if_model(then_type: int) -> onnx.ModelProto:
    then = helper.make_graph([helper.make_node("Cast", ["x"], ["a"], to=then_type)], "then", [], [vi("a", then_type, [2])])
    other = helper.make_graph([helper.make_node("Relu", ["x"], ["b"])], "else", [], [vi("b", F32, [2])])
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other, name="branch")], "g",
        [vi("c", onnx.TensorProto.BOOL, []), vi("x", F32, [2])], [vi("y", F32, [2])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])  # unchecked: it may be wrong


def test_branch_faults_finds_branches_typed_apart():
    assert branch_faults(_if_model(F32)) == []
    bad = _if_model(F16)
    bad.graph.output[0].type.tensor_type.elem_type = onnx.TensorProto.UNDEFINED
    (fault,) = branch_faults(bad)
    assert fault.startswith("If 'branch' output 0: then float16, else float")
    assert strongly_typed_faults(bad)[0].startswith("strict type inference fails: ")


# -- FP8 Q/DQ -------------------------------------------------------------------------------------


def test_fp8_qdq_is_what_tensorrts_explicit_quantization_takes():
    fp32, samples = mlp()
    result = to_fp8(fp32, samples, provider="tensorrt")
    assert any(n.op_type == "QuantizeLinear" for n in result.model.graph.node)
    assert strongly_typed_faults(result.model) == []


def test_qdq_faults_finds_a_zero_point_and_a_scale_tensorrt_refuses():
    def qdq(zero: float, scale_in_graph: bool) -> onnx.ModelProto:
        nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="q"),
                 helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], name="dq")]
        inputs = [vi("x", F32, [4])] + ([vi("s", F32, [])] if scale_in_graph else [])
        inits = [onnx.helper.make_tensor("z", onnx.TensorProto.FLOAT8E4M3FN, [], [zero])]
        if not scale_in_graph:
            inits.append(tensor("s", np.float32(0.5)))
        return model(nodes, inputs, [vi("y", F32, [4])], inits, opset=19)

    assert qdq_faults(qdq(0.0, False)) == []
    assert qdq_faults(qdq(1.0, False)) == ["QuantizeLinear 'q': its zero point is not all zeros",
                                           "DequantizeLinear 'dq': its zero point is not all zeros"]
    assert qdq_faults(qdq(0.0, True)) == ["QuantizeLinear 'q': its scale is not a constant",
                                          "DequantizeLinear 'dq': its scale is not a constant"]
